"""A run on a user's JSONL file, tracked in MLflow, W&B (offline) and TensorBoard at once,
with sampled evaluations and a second evaluation set, exported when it ends: one run,
read back from each place it wrote to."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from gfcr import EvalSet, Evaluation, Sampled
from gfcr.launch.run import execute
from gfcr.checkpoints import checkpoint
from gfcr.evaluation.heldout import pass_at_k
from gfcr.checkpoints.export import ExportHook
from gfcr.tracking.trackers import trackers
from stages import FileTask
from store import RolloutStore
from tests.conftest import tiny_pipeline
from tests.resources import wandb_offline

SUMS = Path(__file__).resolve().parents[2] / "examples" / "data" / "sums.jsonl"
FLIPS = """
SELECT a.prompt_id, a.prompt, a.completion AS before, b.completion AS after
FROM eval_completions a JOIN eval_completions b USING (run_id, eval_set, prompt_id, sample, temperature)
WHERE a.run_id = $run AND a.eval_set = 'heldout' AND a.temperature = 0
  AND a.label = 'step=0' AND b.label = 'step=2' AND a.correct <> b.correct
"""
"""Which held-out prompts the run flipped (greedy, first evaluation against the last):
README "Your own data"."""


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("own")
    bench = root / "bench.jsonl"
    bench.write_text("".join(json.dumps({"question": f"What is {i} + 1?", "answer": str(i + 1)})
                             + "\n" for i in range(6)))
    pipeline = tiny_pipeline(
        task=FileTask(path=str(SUMS), heldout_fraction=0.1,
                      scorer="tests.resources.scorers:even_length"),
        evaluation=Evaluation(size=6, max_tokens=4,
                              sampled=Sampled(samples=4, temperature=1.0, pass_at=(1, 2)),
                              sets=[EvalSet(name="bench", task=FileTask(path=str(bench)),
                                            every=1)]))
    mp = pytest.MonkeyPatch()
    mp.setenv("WANDB_MODE", "offline")
    mp.setenv("WANDB_SILENT", "true")
    try:
        hooks = trackers(("mlflow", "wandb", "tensorboard")) + [ExportHook(root / "final")]
        summary = execute(pipeline, root=root, executor="local", hooks=hooks)
    finally:
        mp.undo()
    return root, pipeline, summary


def test_completions_are_stored_per_prompt_and_sample_and_show_flips(run):
    root, pipeline, summary = run
    with RolloutStore.open(root / "store", read_only=True) as s:
        per_eval = s.sql("SELECT eval_set, label, count(*) AS n, count(DISTINCT prompt_id) AS p "
                         "FROM eval_completions GROUP BY ALL ORDER BY ALL").to_pylist()
        flips = s.sql(FLIPS, {"run": summary.run_id})
        greedy = s.sql("SELECT label, prompt_id, correct FROM eval_completions "
                       "WHERE eval_set = 'heldout' AND temperature = 0").to_pylist()
        meta = s.sql("SELECT count(*) AS n, count(json_extract(meta, '$.id')) AS ids, "
                     "count_if(json_extract_string(meta, '$.difficulty') IN ('easy', 'hard')) "
                     "AS levels FROM rollouts").to_pylist()[0]
    # held-out: 6 prompts x (1 greedy + 4 sampled) at the start and the end; bench: 6
    # prompts at the start, after step 1 (every=1) and at the end
    assert per_eval == [
        {"eval_set": "bench", "label": "step=0", "n": 30, "p": 6},
        {"eval_set": "bench", "label": "step=1", "n": 30, "p": 6},
        {"eval_set": "bench", "label": "step=2", "n": 30, "p": 6},
        {"eval_set": "heldout", "label": "step=0", "n": 30, "p": 6},
        {"eval_set": "heldout", "label": "step=2", "n": 30, "p": 6}]
    assert flips.column_names == ["prompt_id", "prompt", "before", "after"]
    right = {(r["label"], r["prompt_id"]): r["correct"] for r in greedy}
    flipped = {p for (label, p) in right if label == "step=0" and
               right[("step=0", p)] != right[("step=2", p)]}
    assert sorted(flips.column("prompt_id").to_pylist()) == sorted(flipped)
    # the file's own columns, carried into the store with every rollout
    assert meta["n"] == 32 and meta["ids"] == meta["levels"] == 32


def test_pass_at_k_is_the_unbiased_estimator_of_the_stored_samples(run):
    root, _, summary = run
    with RolloutStore.open(root / "store", read_only=True) as s:
        rows = s.sql("SELECT label, eval_set, samples, mean_reward, pass_at FROM evaluations "
                     "WHERE eval_set = 'heldout' ORDER BY step").to_pylist()
        counts = s.sql("SELECT label, prompt_id, count_if(correct)::INTEGER AS c, avg(reward) AS r "
                       "FROM eval_completions WHERE temperature > 0 AND eval_set = 'heldout' "
                       "GROUP BY ALL").to_pylist()
    assert [r["label"] for r in rows] == ["step=0", "step=2"]
    assert any(0 < c["c"] < 4 for c in counts)  # some prompts right in some samples only
    for row in rows:
        mine = [c for c in counts if c["label"] == row["label"]]
        # Chen et al. 2021, eq. 1, by binomial coefficients: 1 - C(n-c, k) / C(n, k)
        by_hand = {k: sum(1 - math.comb(4 - c["c"], k) / math.comb(4, k) for c in mine) / 6
                   for k in (1, 2, 4)}
        assert row["samples"] == 4 and dict(row["pass_at"]) == pytest.approx(by_hand)
        assert row["mean_reward"] == pytest.approx(sum(c["r"] for c in mine) / 6)


def test_pass_at_k_matches_hand_computed_values():
    """n=5 samples, c=2 right: pass@1 = 2/5; pass@2 = 1 - C(3,2)/C(5,2) = 1 - 3/10;
    pass@4 = 1 (fewer than 4 wrong); none right: 0."""
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4)
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)
    assert pass_at_k(5, 2, 4) == 1.0 and pass_at_k(5, 0, 3) == 0.0
    with pytest.raises(ValueError, match="k=6"):
        pass_at_k(5, 2, 6)


def test_each_tracker_holds_the_metrics_and_the_spec(run):
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    root, pipeline, summary = run
    client = MlflowClient(tracking_uri=f"sqlite:///{root / 'mlflow.db'}")
    (ml,) = client.search_runs([client.get_experiment_by_name("tiny").experiment_id])
    logged = {k: [m.step for m in client.get_metric_history(ml.info.run_id, k)]
              for k in ("reward_mean", "heldout_accuracy", "heldout_pass_at_2",
                        "eval/bench/accuracy")}
    assert logged == {"reward_mean": [0, 1], "heldout_accuracy": [0, 2],
                      "heldout_pass_at_2": [0, 2], "eval/bench/accuracy": [0, 1, 2]}
    tb = EventAccumulator(str(root / "tensorboard" / summary.run_id)).Reload()
    assert {"reward_mean", "heldout_pass_at_2", "eval/bench/accuracy"} <= set(tb.Tags()["scalars"])
    assert [e.step for e in tb.Scalars("reward_mean")] == [0, 1]
    spec = tb.Tensors("pipeline/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "type: file" in spec and f"path: {SUMS}" in spec
    (found,) = (root / "wandb").glob(f"wandb/offline-run-*-{summary.run_id}/run-*.wandb")
    wb = wandb_offline.read_run(found)
    assert wb["project"] == "tiny" and wb["config"]["stages.grpo.lr"] == "0.001"
    steps = [h["step"] for h in wb["history"] if "reward_mean" in h]
    assert steps == [0, 1]
    assert any("heldout_pass_at_2" in h for h in wb["history"])
    assert any(f.endswith("pipeline.yaml") for f in wb["files"])


def _run_logits(root: Path, pipeline, run_id: str, ids: torch.Tensor) -> torch.Tensor:
    """The logits of the run's policy at its last checkpoint, loaded as a resume would."""
    from stages.engines.torch_io import TORCH_IO

    ckpt = checkpoint.latest(checkpoint.directory(root, run_id))
    policy = pipeline.policy.build(seed=pipeline.seed)
    TORCH_IO.load_weights(policy.model, ckpt.path / checkpoint.WEIGHTS)
    with torch.no_grad():
        return policy.model(input_ids=ids).logits


def test_the_export_loads_in_transformers_with_the_run_s_logits(run, tmp_path):
    from transformers import AutoModelForCausalLM
    from typer.testing import CliRunner

    from gfcr.cli import app

    root, pipeline, summary = run
    ids = torch.tensor([[5, 17, 23, 42, 8]])
    expected = _run_logits(root, pipeline, summary.run_id, ids)
    cli = CliRunner()
    again = cli.invoke(app, ["export", summary.run_id, "--step", "1", "--out",
                             str(tmp_path / "cli"), "--root", str(root)])
    assert again.exit_code == 0, again.output
    for folder in (root / "final", tmp_path / "cli"):
        assert {"model.safetensors", "config.json", "generation_config.json"} <= {
            p.name for p in folder.iterdir()}
        model = AutoModelForCausalLM.from_pretrained(folder)
        with torch.no_grad():
            assert torch.equal(model(input_ids=ids).logits, expected)
    refused = cli.invoke(app, ["export", summary.run_id, "--step", "0", "--out",
                               str(tmp_path / "none"), "--root", str(root)])
    assert refused.exit_code == 2 and "has no checkpoint of step 0" in refused.output


def test_an_unknown_tracker_is_refused_before_the_run(tmp_path):
    from typer.testing import CliRunner

    from gfcr.cli import app

    result = CliRunner().invoke(app, ["run", "--tracker", "neptune", "--root", str(tmp_path)])
    assert result.exit_code == 2
    assert "tracker 'neptune' is not one of mlflow, wandb, tensorboard" in result.output
    assert not (tmp_path / "store").exists()
