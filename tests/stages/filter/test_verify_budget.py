"""Scorers under a step's time budget and a circuit breaker; a scorer that fails on a
whole step ends the run (issue 12, item 7)."""

from __future__ import annotations

import threading
import time

import pytest

from gfcr.core.rollout import col
from gfcr.procs.helper import call_with_timeout
from stages import Verify
from stages.filter.verify import SCORE_ISOLATION, ScorerFailed
from tests.conftest import tiny_pipeline
from tests.resources import scorers
from tests.resources.rollouts import context, rollouts


def _helpers() -> int:
    return sum(t.name == "gfcr-helper" for t in threading.enumerate())


def _until_the_helper_is_idle() -> None:
    """The released call returns on its helper when that thread next runs: wait for it
    (at most 60 s), so that the next test does not find the helper busy."""
    deadline = time.monotonic() + 60
    while call_with_timeout(lambda: None, 1.0) != "done" and time.monotonic() < deadline:
        time.sleep(0.05)


def test_a_hanging_scorer_in_process_trips_the_breaker_and_holds_one_thread():
    completions = ["fine", "hang"] + ["fine"] * 10
    table = rollouts(["g"] * 12, completion=completions)
    stage = Verify(scorer="tests.resources.scorers:hangs_on_hang", timeout=0.2, breaker=3,
                   worker=False)
    scorers.RELEASE.clear()
    try:
        before = _helpers()
        with pytest.warns(RuntimeWarning, match=r"scoring stopped: the scorer failed 3 times"):
            first = stage.apply(context(step=0), table)
        with pytest.warns(RuntimeWarning, match="circuit breaker"), \
                pytest.raises(ScorerFailed, match="still running"):
            stage.apply(context(step=1), table)  # the hung call still holds its helper
        assert _helpers() <= max(before, 1)  # one helper for this thread, hung or not
    finally:
        scorers.RELEASE.set()
        _until_the_helper_is_idle()
    errors = first.table.column(col.SCORE_ERROR).to_pylist()
    assert errors[0] is None and "ran past its limit" in errors[1]
    assert all("an earlier call of the scorer is still running" in e for e in errors[2:4])
    assert all(e.startswith("not scored: the scorer failed 3 times") for e in errors[4:])
    assert first.keep == [True] + [False] * 11
    assert first.table.column(SCORE_ISOLATION).to_pylist() == ["in_process"] * 12


def test_a_step_stops_scoring_when_its_budget_is_spent():
    table = rollouts(["g"] * 30)
    with pytest.warns(RuntimeWarning, match=r"its time budget of 0.35s is spent"):
        result = Verify(scorer="tests.resources.scorers:sleepy", budget=0.35,
                        worker=False).apply(context(), table)
    errors = result.table.column(col.SCORE_ERROR).to_pylist()
    assert errors[0] is None and errors[-1] == "not scored: its time budget of 0.35s is spent"
    assert errors.count(None) < 30


def test_a_hanging_scorer_in_a_worker_costs_a_timeout_a_call_until_the_breaker():
    """Each hanging call has its worker killed at ``timeout``, so the others are scored;
    the breaker still stops the step after ``breaker`` failures in a row."""
    table = rollouts(["g"] * 6, completion=["hang", "fine", "hang", "hang", "fine", "fine"])
    stage = Verify(scorer="tests.resources.scorers:hangs_on_hang", timeout=1.0, breaker=2)
    with pytest.warns(RuntimeWarning, match=r"scoring stopped: the scorer failed 2 times"):
        result = stage.apply(context(), table)
    errors = result.table.column(col.SCORE_ERROR).to_pylist()
    assert "worker process was killed" in errors[0] and errors[1] is None
    assert all("worker process was killed" in e for e in errors[2:4])
    assert all(e.startswith("not scored: the scorer failed 2 times") for e in errors[4:])


def test_a_step_in_a_worker_stops_scoring_when_its_budget_is_spent():
    """The budget bounds a step's scoring in a worker too: a call still running when it
    is spent is killed, and the rest is not scored."""
    stage = Verify(scorer="tests.resources.scorers:hangs_on_hang", timeout=60.0, budget=3.0)
    Verify(scorer=stage.scorer).apply(context(), rollouts(["g"]))  # a worker loads it
    with pytest.warns(RuntimeWarning, match=r"its time budget of 3s is spent"):
        result = stage.apply(context(), rollouts(["g"] * 3, completion=["x", "hang", "x"]))
    errors = result.table.column(col.SCORE_ERROR).to_pylist()
    assert errors[0] is None and "worker process was killed" in errors[1]
    assert errors[2] == "not scored: its time budget of 3s is spent"


def test_a_scorer_that_fails_on_every_rollout_ends_the_run(tmp_path):
    from gfcr.launch.run import execute
    from stages import GRPO, GroupSample, UniformSampler

    p = tiny_pipeline(stages=[UniformSampler(batch=2), GroupSample(n=2, max_tokens=4),
                              Verify(scorer="tests.resources.scorers:broken"), GRPO()])
    with pytest.raises(ScorerFailed, match=r"stage 'verify', step 0: the scorer failed on "
                                           r"all 4 rollouts \(first error: KeyError"):
        execute(p, root=tmp_path, executor="local")


def test_a_program_the_sandbox_stops_is_a_verdict_not_a_scorer_failure():
    from stages import CodeTests, Sandbox
    from stages.sandbox import unavailable
    from tests.resources.sandbox_users import require

    require(unavailable() is None, f"namespaces unavailable: {unavailable()}")
    table = rollouts(["g"] * 2, completion=["import os\nos.fork()"] * 2,
                     meta=['{"tests": ["assert f() == 1"]}'] * 2, answer=[None] * 2)
    stage = Verify(scorer=CodeTests(sandbox=Sandbox(wall_seconds=3.0)), timeout=10.0, breaker=1)
    result = stage.apply(context(), table)  # no ScorerFailed, no breaker
    assert all("processes" in e for e in result.table.column(col.SCORE_ERROR).to_pylist())
