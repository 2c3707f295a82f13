"""Sleep mode (gfcr.core.capabilities.EngineSleep): the loop puts an engine that sleeps to
sleep before the learner's update and wakes it after, before the weight sync.

The engine here is the real HF engine of a tiny pipeline wrapped in a recorder that
declares sleep mode: a stand-in for a GPU engine's memory release (vLLM's sleep mode
needs a GPU; its CPU build has none), which logs the order of the loop's calls."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from gfcr.core.capabilities import EngineSleep
from gfcr.runner.inprocess import local_services
from gfcr.runner.loop import run_step
from stages import GRPO, GroupSample, UniformSampler, Verify
from store import RolloutStore
from tests.conftest import tiny_pipeline
from tests.resources.control import local_call, runtime


class SleepRecorder:
    """The wrapped engine, plus ``sleep_mode``, ``sleep`` and ``wake_up``; every call
    that matters to the order goes into ``log``, and generating while asleep fails."""

    def __init__(self, engine: Any, log: list[str], *, sleep_mode: bool) -> None:
        self.inner, self.log, self.sleep_mode, self.asleep = engine, log, sleep_mode, False

    @property
    def version(self) -> int:
        return int(self.inner.version)

    @property
    def policy(self) -> Any:
        return self.inner.policy

    def encode(self, text: str) -> list[int]:
        return list(self.inner.encode(text))

    def decode(self, ids: list[int]) -> str:
        return str(self.inner.decode(ids))

    def generate(self, *args: Any, **kw: Any) -> Any:
        assert not self.asleep, "generate called while the engine sleeps"
        self.log.append("generate")
        return self.inner.generate(*args, **kw)

    def update_weights(self, state: Any = None) -> int:
        assert not self.asleep, "weights synced into a sleeping engine"
        self.log.append("update_weights")
        return int(self.inner.update_weights(state))

    def sleep(self) -> None:
        self.log.append("sleep")
        self.asleep = True

    def wake_up(self) -> None:
        self.log.append("wake_up")
        self.asleep = False


class LearnerRecorder:
    def __init__(self, learner: Any, log: list[str], *, fail: bool = False) -> None:
        self.inner, self.log, self.fail = learner, log, fail

    def update(self, ctx: Any, table: Any) -> Any:
        self.log.append("learner.update")
        if self.fail:
            raise RuntimeError("learner failed (test)")
        return self.inner.update(ctx, table)

    def state_dict(self) -> Any:
        return self.inner.state_dict()

    def load_state_dict(self, state: Any) -> None:
        self.inner.load_state_dict(state)


def _runtime(tmp_path: Any, log: list[str], *, sleep_mode: bool, fail: bool = False
             ) -> tuple[Any, SleepRecorder, RolloutStore]:
    store = RolloutStore.open(tmp_path / "store")
    # no dynamic sampling: every rollout of the random tiny policy reaches the learner
    stages = [UniformSampler(batch=4), GroupSample(n=4, max_tokens=6), Verify(), GRPO(lr=1e-3)]
    rt = runtime(tiny_pipeline(steps=1, stages=stages), store, "r")
    local = rt.services.generator
    engine = SleepRecorder(local.engine, log, sleep_mode=sleep_mode)
    assert isinstance(engine, EngineSleep)
    learner = LearnerRecorder(rt.services.learner.learner, log, fail=fail)
    services = local_services(engine, local.policy, learner)
    return replace(rt, services=services), engine, store


def _step(tmp_path: Any, *, sleep_mode: bool) -> list[str]:
    log: list[str] = []
    rt, _, store = _runtime(tmp_path, log, sleep_mode=sleep_mode)
    with store:
        run_step(rt, "r", 0, local_call)
    return log


def test_the_loop_sleeps_the_engine_around_the_learner_update(tmp_path: Any) -> None:
    log = _step(tmp_path, sleep_mode=True)
    at = log.index("learner.update")
    assert log[at - 1:at + 3] == ["sleep", "learner.update", "wake_up", "update_weights"]
    assert log.count("sleep") == log.count("wake_up") == 1
    assert log.index("generate") < log.index("sleep")


def test_an_engine_without_sleep_mode_is_not_put_to_sleep(tmp_path: Any) -> None:
    log = _step(tmp_path, sleep_mode=False)
    assert "learner.update" in log and "sleep" not in log and "wake_up" not in log


def test_a_failed_update_still_wakes_the_engine(tmp_path: Any) -> None:
    log: list[str] = []
    rt, engine, store = _runtime(tmp_path, log, sleep_mode=True, fail=True)
    with store, pytest.raises(RuntimeError, match="learner failed"):
        run_step(rt, "r", 0, local_call)
    assert log[-3:] == ["sleep", "learner.update", "wake_up"] and not engine.asleep
