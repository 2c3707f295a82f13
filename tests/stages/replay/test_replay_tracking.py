"""Rollout Replay through the real loop, store and MLflow: replayed rows are committed with
their lineage and trained on, and how much was replayed and how stale it was reach MLflow."""

from __future__ import annotations

from mlflow.tracking import MlflowClient

from gfcr.launch.run import execute
from gfcr.tracking.mlflow_hook import MlflowHook
from stages import GRPO, DynamicSampling, GroupSample, RolloutReplay, UniformSampler, Verify
from store import RolloutStore
from tests.conftest import tiny_pipeline
from tests.resources.digits import Digits


def test_replay_is_committed_trained_and_tracked(tmp_path):
    p = tiny_pipeline(task=Digits(), steps=3, stages=[
        UniformSampler(batch=2), RolloutReplay(groups=4, window=2),
        GroupSample(n=4, max_tokens=4), Verify(), DynamicSampling(), GRPO(lr=1e-3)])
    summary = execute(p, root=tmp_path, executor="local", hooks=[MlflowHook()])
    with RolloutStore.open(tmp_path / "store", read_only=True) as s:
        rows = s.sql("""SELECT r.step, r.replay_count, r.consumed_at_step, r.parent_id,
                               r.policy_version_start, o.policy_version_start AS original_version,
                               r.logprobs = o.logprobs AS same_logprobs
                        FROM rollouts r JOIN rollouts o ON r.parent_id = o.rollout_id
                        WHERE r.replay_count > 0""").to_pylist()
    assert rows, "the digits task keeps groups with signal: step 1 and 2 replay some"
    assert all(r["consumed_at_step"] == r["step"] and r["same_logprobs"] for r in rows)
    assert all(r["policy_version_start"] == r["original_version"] < r["step"] + 1 for r in rows)
    client = MlflowClient(tracking_uri=summary.mlflow)
    (run,) = client.search_runs([client.get_experiment_by_name("tiny").experiment_id])
    replayed = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "replay/rows")}
    assert replayed[0] == 0 and replayed[1] + replayed[2] == len(rows)
    stale = client.get_metric_history(run.info.run_id, "replay/staleness_mean")
    assert stale and all(m.value >= 1 for m in stale)
    assert client.get_metric_history(run.info.run_id, "replay/share")
