"""Resume: a run stopped after step k (or killed after committing steps beyond its last
checkpoint) and resumed ends with the weights and rollouts of an uninterrupted run,
commits every step once, continues its MLflow run, and refuses a changed pipeline."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute  # noqa: F401
import pytest
import torch
from mlflow.tracking import MlflowClient
from safetensors.torch import load_file
from typer.testing import CliRunner

from gfcr import execute
from gfcr.cli import app
from gfcr.checkpoints import checkpoint
from gfcr.checkpoints.resume import ResumeError
from gfcr.tracking.mlflow_hook import MlflowHook
from stages import GRPO, DynamicSampling, GroupSample, RolloutReplay, UniformSampler, Verify
from store import RolloutStore
from tests.conftest import tiny_pipeline
from tests.resources.digits import Digits

SAME = ["step", "rollout_id", "group_id", "parent_id", "prompt", "sample_idx", "completion_ids",
        "logprobs", "reward", "kept", "dropped_by", "advantage", "policy_version_start",
        "replay_count", "consumed_at_step"]
"""Columns equal between two runs of one pipeline under one run id (not timings)."""


def _pipeline(steps, **checkpointing):
    """Learns from the first step (Digits, lr 1e-2), and replays stored groups, so a
    resumed step depends on weights, optimizer state and the history it reads."""
    p = tiny_pipeline(task=Digits(), steps=steps, stages=[
        UniformSampler(batch=4), RolloutReplay(groups=4, max_share=0.5, window=2),
        GroupSample(n=4, max_tokens=4), Verify(), DynamicSampling(), GRPO(lr=1e-2)])
    return p.with_overrides([f"checkpoint.{k}={v}" for k, v in checkpointing.items()])


def _weights(root, run_id):
    return load_file(checkpoint.latest(checkpoint.directory(root, run_id)).path
                     / "model.safetensors")


def _rows(root, run_id):
    with RolloutStore.open(root / "store", read_only=True) as s:
        return s.sql("SELECT * FROM rollouts WHERE run_id = ? ORDER BY step, rollout_id",
                     [run_id])


def _steps(root, run_id):
    with RolloutStore.open(root / "store", read_only=True) as s:
        return s.sql("SELECT step FROM steps WHERE run_id = ? ORDER BY step",
                     [run_id])["step"].to_pylist()


def _assert_same_run(root_a, root_b):
    """Run "b" under ``root_b`` ended as run "b" under ``root_a``: same weights, same
    rollouts, each once. (One run id for both: stored ids hash it, and replay draws
    groups in id order.)"""
    wa, wb = _weights(root_a, "b"), _weights(root_b, "b")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    ra, rb = _rows(root_a, "b"), _rows(root_b, "b")
    assert ra.num_rows == rb.num_rows
    assert ra.select(SAME).to_pylist() == rb.select(SAME).to_pylist()
    ids = rb["rollout_id"].to_pylist()
    assert len(ids) == len(set(ids))  # nothing committed twice


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """Run A: run "b" for 5 steps without a stop."""
    root = tmp_path_factory.mktemp("a")
    summary = execute(_pipeline(5), root=root, executor="local", run_id="b")
    assert summary.history[-1]["policy_version"] == 5  # every step updated the policy
    return root, summary


def test_stopped_after_step_k_and_resumed_matches_an_uninterrupted_run(tmp_path,
                                                                       uninterrupted):
    root_a, a = uninterrupted
    first = execute(_pipeline(3), root=tmp_path, executor="local", run_id="b")
    assert first.resumed_from is None and checkpoint.latest(
        checkpoint.directory(tmp_path, "b")).step == 2  # a checkpoint after the last step
    second = execute(_pipeline(5), root=tmp_path, executor="local", run_id="b")
    assert second.resumed_from == 2 and len(second.history) == 5
    assert _steps(tmp_path, "b") == [0, 1, 2, 3, 4]
    assert not any("resume/replay_mismatch" in m for m in second.history)
    _assert_same_run(root_a, tmp_path)
    assert second.accuracy_before == a.accuracy_before  # carried by the checkpoint
    assert second.accuracy_after == a.accuracy_after


class Crash(RuntimeError):
    pass


class CrashAt:
    """A hook that kills the run after ``step`` was committed (and logged)."""

    def __init__(self, step):
        self.step = step

    def on_step(self, *, step, **_):
        if step == self.step:
            raise Crash(f"crash after step {step}")


def test_a_crash_after_the_last_checkpoint_replays_committed_steps_once(tmp_path,
                                                                         uninterrupted):
    root_a, a = uninterrupted
    p = _pipeline(5, every=2)
    with pytest.raises(Crash):
        execute(p, root=tmp_path, executor="local", run_id="b",
                hooks=[MlflowHook(), CrashAt(2)])
    # steps 0-2 committed, the newest checkpoint is after step 1; a write of the next one
    # was killed midway (no COMPLETE marker): it must be ignored, then replaced
    where = checkpoint.directory(tmp_path, "b")
    assert _steps(tmp_path, "b") == [0, 1, 2] and checkpoint.latest(where).step == 1
    (where / "step-3").mkdir()
    (where / "step-3" / "model.safetensors").write_bytes(b"torn")

    summary = execute(p, root=tmp_path, executor="local", run_id="b", hooks=[MlflowHook()])
    assert summary.resumed_from == 1
    assert summary.history[2]["resume/replay_mismatch"] == 0.0  # step 2 replayed exactly
    assert _steps(tmp_path, "b") == [0, 1, 2, 3, 4]
    assert [c.step for c in checkpoint.complete(where)] == [3, 4]
    _assert_same_run(root_a, tmp_path)

    client = MlflowClient(tracking_uri=summary.mlflow)
    (run,) = client.search_runs([client.get_experiment_by_name("tiny").experiment_id])
    assert run.info.status == "FINISHED" and run.data.tags["gfcr.resumed"] == "true"
    logged = [m.step for m in client.get_metric_history(run.info.run_id, "reward_mean")]
    assert logged == [0, 1, 2, 3, 4]  # step 2 logged once, before the crash


def test_a_replayed_step_trains_on_the_stored_rows_when_regeneration_differs(
        tmp_path, uninterrupted, monkeypatch):
    """Generation of the replayed step made non-deterministic (another sampling seed, as
    a fleet's batching would): the replay regenerates other rows, yet the learner trains
    on the rows the store holds, so the resumed run still ends as the uninterrupted one."""
    from gfcr.runner.inprocess import LocalLearner

    root_a, _ = uninterrupted
    p = _pipeline(5, every=2)
    with pytest.raises(Crash):
        execute(p, root=tmp_path, executor="local", run_id="b", hooks=[CrashAt(2)])
    trained: dict[int, list] = {}
    update, params = LocalLearner.update, GroupSample.params

    def recording(self, ctx, batch):
        trained[ctx.step] = batch.select(["rollout_id", "completion_ids"]).to_pylist()
        return update(self, ctx, batch)

    def perturbed(self, ctx):
        out = params(self, ctx)
        return out.model_copy(update={"seed": out.seed + 1}) if ctx.step == 2 else out

    monkeypatch.setattr(LocalLearner, "update", recording)
    monkeypatch.setattr(GroupSample, "params", perturbed)
    with pytest.warns(RuntimeWarning, match="replaying step 2 .* trains on the stored rows"):
        summary = execute(p, root=tmp_path, executor="local", run_id="b")
    assert summary.resumed_from == 1 and summary.history[2]["resume/replay_mismatch"] > 0
    stored = _rows(tmp_path, "b").filter(pa.compute.equal(_rows(tmp_path, "b")["step"], 2))
    kept = stored.filter(stored["kept"]).select(["rollout_id", "completion_ids"]).to_pylist()
    key = lambda r: r["rollout_id"]  # noqa: E731
    assert sorted(trained[2], key=key) == sorted(kept, key=key)  # exactly the stored rows
    _assert_same_run(root_a, tmp_path)  # and so the same weights and later rollouts


def test_a_resume_logs_the_steps_a_killed_run_left_out_of_mlflow(tmp_path):
    import mlflow

    p = _pipeline(4, every=2)
    killed = MlflowHook(flush_seconds=3600)  # holds every step's metrics until the end
    killed.on_end = lambda **_: mlflow.end_run("KILLED")  # killed: no final batch
    with pytest.raises(Crash):
        execute(p, root=tmp_path, executor="local", run_id="b", hooks=[killed, CrashAt(2)])
    client = MlflowClient(tracking_uri=killed.uri)
    (run,) = client.search_runs([client.get_experiment_by_name("tiny").experiment_id])
    assert client.get_metric_history(run.info.run_id, "reward_mean") == []

    summary = execute(p, root=tmp_path, executor="local", run_id="b", hooks=[MlflowHook()])
    assert summary.resumed_from == 1  # step 2 is replayed, steps 0-1 are not run again
    history = client.get_metric_history(run.info.run_id, "reward_mean")
    assert [m.step for m in history] == [0, 1, 2, 3]  # each once
    with RolloutStore.open(tmp_path / "store", read_only=True) as s:
        stored = s.sql("SELECT step, metrics['reward_mean'] AS r FROM steps "
                       "WHERE run_id = 'b' ORDER BY step").column("r").to_pylist()
    assert [m.value for m in history] == stored


def test_resuming_with_a_changed_pipeline_is_refused_and_writes_nothing(tmp_path):
    execute(_pipeline(2), root=tmp_path, executor="local", run_id="b")
    with RolloutStore.open(tmp_path / "store", read_only=True) as s:
        before = s.snapshots().num_rows, s.sql("SELECT * FROM runs").to_pylist()
    changed = _pipeline(3).with_overrides(["grpo.lr=0.5"])
    with pytest.raises(ResumeError) as err:
        execute(changed, root=tmp_path, executor="local", run_id="b")
    message = str(err.value)
    assert _pipeline(2).spec_hash() in message and changed.spec_hash() in message
    assert "stages.grpo.lr: 0.01 -> 0.5" in message
    with pytest.raises(ResumeError, match="already holds its steps 0..1; give steps >= 2"):
        execute(_pipeline(1), root=tmp_path, executor="local", run_id="b")
    with RolloutStore.open(tmp_path / "store", read_only=True) as s:
        assert (s.snapshots().num_rows, s.sql("SELECT * FROM runs").to_pylist()) == before
    assert checkpoint.latest(checkpoint.directory(tmp_path, "b")).step == 1


def test_cli_resumes_a_run_from_its_stored_pipeline(tmp_path):
    execute(_pipeline(1), root=tmp_path, executor="local", run_id="b")
    runner = CliRunner()
    args = ["--root", str(tmp_path), "--executor", "local", "--no-track", "--json"]
    done = runner.invoke(app, ["run", "--resume", "b", "--steps", "2", *args])
    assert done.exit_code == 0, done.output
    assert '"resumed_from": 0' in done.stdout and _steps(tmp_path, "b") == [0, 1]
    changed = runner.invoke(app, ["run", "--resume", "b", "--set", "grpo.lr=1", *args])
    assert changed.exit_code == 2 and "stages.grpo.lr: 0.01 -> 1" in changed.output
    missing = runner.invoke(app, ["run", "--resume", "nope", *args])
    assert missing.exit_code == 2 and "no run 'nope'" in missing.output


def test_prefect_executor_resumes_like_the_local_one(tmp_path, uninterrupted, prefect_server):
    root_a, a = uninterrupted
    execute(_pipeline(3), root=tmp_path, executor="prefect", run_id="b")
    summary = execute(_pipeline(5), root=tmp_path, executor="prefect", run_id="b")
    assert summary.resumed_from == 2
    _assert_same_run(root_a, tmp_path)


def test_a_run_stored_before_a_field_existed_resumes_as_it_ran(tmp_path):
    """A spec stored before the tiny policy had a ``tokenizer`` field (the character
    tokenizer then, the byte one by default now) resumes with the character tokenizer
    (the checkpoint's vocabulary); asking for the byte one is refused as a change."""
    import yaml

    from gfcr.checkpoints.resume import as_stored

    execute(_pipeline(1), root=tmp_path, executor="local", run_id="old")
    old = _pipeline(1).to_dict()
    assert old["policy"].pop("tokenizer") == "char"
    with RolloutStore.open(tmp_path / "store") as s:  # as the code of that day stored it
        s._transaction(lambda con: con.execute("UPDATE lake.runs SET spec_yaml = ? WHERE "
                                               "run_id = 'old'", [yaml.safe_dump(old)]))
    assert as_stored(old)["policy"]["tokenizer"] == "char"
    assert as_stored(_pipeline(1).with_overrides(["policy.tokenizer=byte"]).to_dict())[
        "policy"]["tokenizer"] == "byte"  # a value that is there stays
    byte = _pipeline(2).with_overrides(["policy.tokenizer=byte"])
    with pytest.raises(ResumeError, match="policy.tokenizer: char -> byte"):
        execute(byte, root=tmp_path, executor="local", run_id="old")
    done = CliRunner().invoke(app, ["run", "--resume", "old", "--steps", "2", "--root",
                                    str(tmp_path), "--executor", "local", "--no-track", "--json"])
    assert done.exit_code == 0, done.output
    assert '"resumed_from": 0' in done.stdout and _steps(tmp_path, "old") == [0, 1]
