"""Any reasoning-gym task runs from a pipeline file of the README's shape, with no code
beyond the file: ``letter_counting`` (whose prompts hold non-ASCII letters such as "à")
and ``spell_backward`` (named by no other test or doc). The run's held-out accuracies
land in the store's ``evaluations`` table."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

PIPELINE = """\
from gfcr import Evaluation, Pipeline
from stages import (GRPO, HF, SFT, DynamicSampling, GroupSample, ReasoningGym, TinyLlama,
                    UniformSampler, Verify)

pipeline = Pipeline(
    name="{name}",
    steps=2,
    task=ReasoningGym(dataset="{dataset}", train_size={train_size}, heldout_size=8),
    policy=TinyLlama(hidden_size=32, num_layers=1, num_heads=2),
    engine=HF(device="cpu"),
    warmstart=SFT(steps=3, batch_size=8),
    evaluation=Evaluation(size=8, max_tokens=4),
    stages=[
        UniformSampler(batch=4),
        GroupSample(n=4, max_tokens=4),
        Verify(),
        DynamicSampling(),
        GRPO(lr=1e-5),
    ],
)
"""


def _gfcr(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gfcr.cli", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=600)


@pytest.mark.parametrize("dataset,train_size", [
    ("letter_counting", 1200),  # the 1135th training prompt holds an "à"
    ("spell_backward", 64),
])
def test_a_task_runs_from_a_pipeline_file(tmp_path, dataset, train_size):
    path = tmp_path / f"{dataset}.py"
    path.write_text(PIPELINE.format(name=dataset.replace("_", "-"), dataset=dataset,
                                    train_size=train_size))
    root = tmp_path / "root"
    run = _gfcr("run", str(path), "--json", "--executor", "local", "--no-track",
                "--root", str(root), cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    summary = json.loads(run.stdout.strip().splitlines()[-1])
    assert summary["rollouts"] >= 2 * 4 * 4 and summary["steps"] == 2
    query = _gfcr("sql", "SELECT run_id, step, label, accuracy, n_prompts, temperature, "
                  "max_tokens FROM evaluations ORDER BY evaluated_at", "--format", "json",
                  "--root", str(root), cwd=tmp_path)
    assert query.returncode == 0, query.stderr
    rows = json.loads(query.stdout)
    assert [(r["run_id"], r["step"], r["label"]) for r in rows] == [
        (summary["run_id"], 0, "initial"), (summary["run_id"], 0, "step=0"),
        (summary["run_id"], 2, "step=2")]
    assert [r["accuracy"] for r in rows] == [summary["accuracy_before"],
                                             summary["accuracy_warmstart"],
                                             summary["accuracy_after"]]
    assert {(r["n_prompts"], r["temperature"], r["max_tokens"]) for r in rows} == {(8, 0.0, 4)}
