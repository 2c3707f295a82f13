"""Asynchronous steps in this process (gfcr.runner.rounds): with ``max_staleness = 1`` the
round-0 batch of step s is drawn and generated during step s - 1, on the engine's own
thread, with the weights the run had at the start of step s - 1, and no worker."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gfcr.launch.run import execute
from gfcr.checkpoints.cancel import RunCancelled, Stop
from stages import GRPO, VADE, GroupSample, UniformSampler, Verify
from store import RolloutStore
from tests.conftest import tiny_pipeline
from tests.resources.digits import Digits

SAME = ["step", "rollout_id", "group_id", "prompt", "sample_idx", "completion_ids", "logprobs",
        "policy_version_start", "reward", "kept", "advantage"]


def _rows(root: Path, run_id: str) -> list[dict[str, Any]]:
    with RolloutStore.open(root / "store", read_only=True) as s:
        table = s.sql(f"SELECT * FROM rollouts WHERE run_id = '{run_id}' "
                      "ORDER BY step, prompt, sample_idx")
    return table.select(SAME).to_pylist()


def _pipeline(steps: int, **fields: Any) -> Any:
    return tiny_pipeline(task=Digits(), steps=steps, max_staleness=1, **fields)


def test_a_run_with_k_1_needs_no_worker_and_uses_the_plans_drawn_ahead(
        tmp_path: Path) -> None:
    # no worker, and staleness recorded; and D5: VADE reads the run's history, its plan
    # for step s is drawn at step s - 1 (history as of then) and generated there, never
    # drawn again and regenerated synchronously with old weights
    pipeline = _pipeline(3, stages=[VADE(batch=4, rollouts=4), GroupSample(n=4, max_tokens=2),
                                    Verify(), GRPO(lr=1e-2)])
    warnings: list[str] = []

    class Warned:
        def on_warning(self, *, message: str, **_: Any) -> None:
            warnings.append(message)

    summary = execute(pipeline, root=tmp_path, executor="local", run_id="v", hooks=[Warned()])
    assert not warnings
    assert [m["staleness/max"] for m in summary.history] == [0.0, 1.0, 1.0]
    assert [m["policy_version"] for m in summary.history] == [1.0, 2.0, 3.0]
    starts = {(r["step"], r["policy_version_start"]) for r in _rows(tmp_path, "v")}
    # step 0 on v0; step s > 0 on the weights of the start of step s - 1
    assert starts == {(0, 0), (1, 0), (2, 1)}
    assert all(m["train/offpolicy_share"] == 1.0 for m in summary.history[1:])


def test_a_run_stopped_with_a_round_in_flight_resumes_as_the_uninterrupted_run(
        tmp_path: Path) -> None:
    # stopped after step 1, while step 2's batch generates on the engine's thread; the
    # checkpoint keeps that batch, so the resumed run trains on exactly what the
    # uninterrupted one did
    pipeline = _pipeline(4, stages=[UniformSampler(batch=4), GroupSample(n=4, max_tokens=4),
                                    Verify(), GRPO(lr=1e-2)])
    whole = execute(pipeline, root=tmp_path / "whole", executor="local", run_id="b")
    stop = Stop()

    class StopAfterStep1:
        def on_step(self, *, step: int, **_: Any) -> None:
            if step == 1:
                stop.request("the test stops after step 1")

    with pytest.raises(RunCancelled):
        execute(pipeline, root=tmp_path / "cut", executor="local", run_id="b",
                hooks=[StopAfterStep1()], stop=stop)
    assert {r["step"] for r in _rows(tmp_path / "cut", "b")} == {0, 1}
    resumed = execute(pipeline, root=tmp_path / "cut", executor="local", run_id="b")
    assert resumed.resumed_from == 1
    assert resumed.history[2]["staleness/max"] == 1
    assert _rows(tmp_path / "cut", "b") == _rows(tmp_path / "whole", "b")
    assert [m["policy_version"] for m in resumed.history] == [
        m["policy_version"] for m in whole.history]
    assert resumed.accuracy_after == whole.accuracy_after


def test_a_load_behind_a_generation_in_flight_gets_the_weights_of_its_hand_out() -> None:
    # the engine generates on its own thread; a load submitted meanwhile is queued with a
    # frozen copy, so the learner may update at once without changing what is loaded
    import threading

    import torch

    from gfcr.runner.inprocess import LocalGenerator, LocalLearner
    from stages import HF, TinyLlama

    spec = TinyLlama(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    learner_policy, engine_policy = spec.build(seed=0), spec.build(seed=1)
    learner = LocalLearner(learner_policy, None)
    generator = LocalGenerator(HF(device="cpu").build(engine_policy, seed=0), engine_policy,
                               shared=False, background=True)
    release = threading.Event()

    class Blocked:
        def generate(self, ctx: Any, plan: Any, engine: Any, on_segment: Any) -> str:
            release.wait(timeout=60)
            return "generated"

    try:
        pending = generator.submit(None, Blocked(), None, [])  # type: ignore[arg-type]
        handle = learner.publish()
        handed_out = {k: v.clone() for k, v in learner_policy.model.state_dict().items()}
        generator.load(handle)  # behind the blocked generation
        with torch.no_grad():  # the learner updates at once
            for p in learner_policy.model.parameters():
                p.add_(1.0)
        release.set()
        assert pending.result() == "generated"
        generator.drain()
    finally:
        release.set()
        generator.close()
    assert generator.version == engine_policy.version == handle.version == 1
    loaded = engine_policy.model.state_dict()
    assert all(torch.equal(loaded[k], v) for k, v in handed_out.items())
