"""Running pipelines end to end: local and Prefect executors, store contents, learning."""

from __future__ import annotations

import time

import pyarrow.compute as pc
import pytest

from gfcr import execute
from stages import GRPO, GroupSample, UniformSampler, Verify
from store import RolloutStore
from tests.conftest import tiny_pipeline
from tests.resources.digits import Digits

COMPARE = ["step", "prompt", "sample_idx", "completion", "reward", "kept", "dropped_by",
           "advantage", "logprobs"]


def _rows(root, run_id):
    with RolloutStore.open(root / "store", read_only=True) as s:
        t = s.sql(f"SELECT * FROM rollouts WHERE run_id = '{run_id}' "
                  "ORDER BY step, prompt, sample_idx")
    return t


def test_local_run_stores_every_rollout(tmp_path):
    # one-token answers to the digits task: some groups flat (dropped), some not
    pipeline = tiny_pipeline(task=Digits()).with_overrides(["group.max_tokens=1"])
    summary = execute(pipeline, root=tmp_path, executor="local")
    t = _rows(tmp_path, summary.run_id)
    assert t.num_rows == summary.rollouts == pipeline.steps * 4 * 4
    dropped = t.filter(pc.invert(t["kept"]))
    assert 0 < dropped.num_rows < t.num_rows
    assert pc.all(pc.is_valid(dropped["dropped_by"])).as_py()
    assert pc.all(pc.is_valid(dropped["drop_reason"])).as_py()
    kept = t.filter(t["kept"])
    assert pc.all(pc.is_valid(kept["advantage"])).as_py()
    assert set(kept["consumed_at_step"].to_pylist()) <= {0, 1}
    with RolloutStore.open(tmp_path / "store", read_only=True) as s:
        steps = s.sql("SELECT step, policy_version FROM steps ORDER BY step").to_pylist()
        runs = s.sql("SELECT status FROM runs").to_pylist()
    assert [r["step"] for r in steps] == [0, 1]
    assert runs == [{"status": "finished"}]


def test_steps_report_the_time_of_each_stage(tmp_path):
    class Steps:
        def __init__(self):
            self.seen = []

        def on_step(self, *, metrics, cpu, **_):
            self.seen.append((metrics, cpu))

    pipeline, steps = tiny_pipeline(task=Digits()), Steps()
    execute(pipeline, root=tmp_path, executor="local", hooks=[steps])
    labels = {s.label for s in pipeline.stages}
    assert len(steps.seen) == pipeline.steps
    for metrics, cpu in steps.seen:
        wall = {k.removeprefix("time/"): v for k, v in metrics.items() if k.startswith("time/")}
        assert set(wall) == set(cpu) == labels  # the commit is the runtime's, not a stage
        assert all(v > 0 for v in wall.values()) and all(v >= 0 for v in cpu.values())
        assert sum(wall.values()) <= metrics["step_seconds"]


def test_prefect_executor_matches_local(tmp_path, pipeline, prefect_server):
    local = execute(pipeline, root=tmp_path / "a", executor="local")
    flow = execute(pipeline, root=tmp_path / "b", executor="prefect")
    a = _rows(tmp_path / "a", local.run_id).select(COMPARE).to_pylist()
    b = _rows(tmp_path / "b", flow.run_id).select(COMPARE).to_pylist()
    assert a == b
    assert flow.accuracy_after == local.accuracy_after
    assert not (tmp_path / "b" / "staging" / flow.run_id).exists()
    timed = {k for m in flow.history for k in m if k.startswith("time/")}  # inside the tasks
    assert timed == {f"time/{s.label}" for s in pipeline.stages}


def test_prefect_flow_has_one_task_per_stage_per_step(tmp_path, pipeline, prefect_server):
    import asyncio

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName

    summary = execute(pipeline, root=tmp_path, executor="prefect")

    async def names():
        async with get_client() as client:
            runs = await client.read_flow_runs(flow_run_filter=FlowRunFilter(
                name=FlowRunFilterName(any_=[summary.run_id])))
            (run,) = runs
            tasks = await client.read_task_runs(
                flow_run_filter=FlowRunFilter(id={"any_": [run.id]}))
            return run.state.type.value, sorted(t.name for t in tasks)

    expected = {f"{s.label}[step={n}]" for s in pipeline.stages for n in range(2)}
    expected |= {f"commit[step={n}]" for n in range(2)}
    expected |= {"evaluate[step=0]", "evaluate[step=2]", "checkpoint[step=1]"}
    # The server records task runs from events, asynchronously: the last ones can land a
    # moment after the flow returns, so read until they are all there (or 60 s passed).
    deadline = time.monotonic() + 60.0
    state, task_names = asyncio.run(names())
    while len(task_names) < len(expected) and time.monotonic() < deadline:
        time.sleep(0.5)
        state, task_names = asyncio.run(names())
    assert state == "COMPLETED"
    assert set(task_names) == expected and len(task_names) == len(expected)


def test_scorer_errors_are_recorded_not_fatal(tmp_path):
    p = tiny_pipeline(stages=[UniformSampler(batch=4), GroupSample(n=4, max_tokens=6),
                              Verify(scorer="tests.resources.digits:explode"), GRPO()])
    summary = execute(p, root=tmp_path, executor="local")
    t = _rows(tmp_path, summary.run_id)
    errors = t.filter(pc.is_valid(t["score_error"]))
    assert errors.num_rows > 0
    assert set(errors["drop_reason"].to_pylist()) == {"score_error"}
    assert all("reward function bug" in e for e in errors["score_error"].to_pylist())
    assert not any(errors["kept"].to_pylist())
    assert set(t["score_isolation"].to_pylist()) == {"worker"}  # on every scored row


def test_reward_and_heldout_accuracy_rise_on_a_learnable_task(tmp_path):
    p = tiny_pipeline(
        task=Digits(), steps=14,
        stages=[UniformSampler(batch=8), GroupSample(n=8, max_tokens=4), Verify(),
                GRPO(lr=1e-2)])
    p = p.with_overrides(["evaluation.max_tokens=4"])
    summary = execute(p, root=tmp_path, executor="local")
    rewards = [m["reward_mean"] for m in summary.history]
    assert sum(rewards[-3:]) / 3 > sum(rewards[:3]) / 3 + 0.2, rewards
    assert summary.accuracy_before < 0.5 <= summary.accuracy_after, summary


def test_warm_start_is_measured_and_cached(tmp_path):
    from stages import SFT

    p = tiny_pipeline(warmstart=SFT(steps=20, batch_size=16), steps=1)
    first = execute(p, root=tmp_path, executor="local")
    assert first.warmstart["cached"] == 0.0 and first.accuracy_warmstart is not None
    again = execute(p, root=tmp_path, executor="local")
    assert again.warmstart["cached"] == 1.0
    assert again.accuracy_warmstart == first.accuracy_warmstart  # same weights from cache
    assert again.accuracy_before == first.accuracy_before
    t = _rows(tmp_path, again.run_id)
    assert set(t["policy_version_start"].to_pylist()) == {1}  # the warm start is version 1


def test_initial_evaluation_can_be_skipped_and_the_spec_keeps_its_hash(tmp_path):
    from gfcr import Pipeline
    from stages import SFT

    p = tiny_pipeline(warmstart=SFT(steps=4, batch_size=8), steps=1)
    assert "initial" not in p.to_dict()["evaluation"]  # older specs keep their hash
    skip = p.with_overrides(["evaluation.initial=false"])
    assert skip.spec_hash() != p.spec_hash()
    assert Pipeline.from_yaml(skip.to_yaml()).evaluation.initial is False
    summary = execute(skip, root=tmp_path, executor="local")
    assert summary.accuracy_warmstart is None and summary.warmstart["cached"] == 0.0
    with RolloutStore.open(tmp_path / "store", read_only=True) as s:
        labels = s.sql("SELECT label FROM evaluations ORDER BY step").column("label")
    assert labels.to_pylist() == ["step=0", "step=1"]
