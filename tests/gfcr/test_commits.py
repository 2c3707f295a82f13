"""Background commits: step k's commit runs behind step k+1, in order, finished before
the history, a checkpoint and the run's end that depend on it; a failed commit fails the
run and nothing after it is committed or checkpointed."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from gfcr import execute
from gfcr.checkpoints import checkpoint
from gfcr.runner.commits import BackgroundCommits, LazyHistory
from store import RolloutStore
from tests.conftest import tiny_pipeline


def _commits(pool):
    return BackgroundCommits(lambda name, fn, *args: pool.submit(fn, *args))


def test_commits_run_behind_the_caller_one_at_a_time_in_order():
    done, started = [], threading.Event()

    def slow(step):
        started.set()
        time.sleep(0.05)
        done.append(step)
    with ThreadPoolExecutor(4) as pool:
        commits = _commits(pool)
        commits("commit[step=0]", slow, 0)
        assert started.wait(5) and done == []  # handed over, not waited for
        commits("commit[step=1]", slow, 1)     # waits for step 0 first
        assert done == [0]
        commits.wait()
    assert done == [0, 1]


def test_a_failed_commit_raises_at_the_next_wait_and_keeps_raising():
    def fail(step):
        raise RuntimeError(f"disk full at step {step}")
    ran = []
    with ThreadPoolExecutor(1) as pool:
        commits = _commits(pool)
        commits("commit[step=3]", fail, 3)
        with pytest.raises(RuntimeError, match="step 3"):
            commits("commit[step=4]", ran.append, 4)
        with pytest.raises(RuntimeError, match="step 3"):
            commits.wait()
    assert ran == []


def test_lazy_history_builds_on_first_read_only():
    built = []

    class History:
        snapshot = 7

        def prompt_stats(self):
            return "stats"
    lazy = LazyHistory(lambda: built.append(1) or History())
    assert built == [] and "not read yet" in repr(lazy)
    assert lazy.snapshot == 7 and lazy.prompt_stats() == "stats" and built == [1]


class _FailingStore:
    """A store whose commit of ``step`` fails (after ``delay`` seconds)."""

    def __init__(self, store, step, delay=0.0):
        self._store, self._step, self._delay = store, step, delay

    def commit_step(self, run_id, step, *args, **kw):
        if step == self._step:
            time.sleep(self._delay)
            raise RuntimeError(f"catalog unreachable at step {step}")
        return self._store.commit_step(run_id, step, *args, **kw)

    def __getattr__(self, name):
        return getattr(self._store, name)


def _run_failing(tmp_path, executor, **overrides):
    p = tiny_pipeline(steps=3).with_overrides([f"{k}={v}" for k, v in overrides.items()])
    with RolloutStore.open(tmp_path / "store") as store:
        with pytest.raises(RuntimeError, match="catalog unreachable at step 1"):
            execute(p, root=tmp_path, executor=executor, run_id="r",
                    store=_FailingStore(store, 1, delay=0.2))
        steps = store.sql("SELECT step FROM steps ORDER BY step")["step"].to_pylist()
        status = store.sql("SELECT status FROM runs")["status"].to_pylist()
    saved = [c.step for c in checkpoint.complete(checkpoint.directory(tmp_path, "r"))]
    return steps, status, saved


def test_a_failed_commit_fails_the_run_before_a_later_step_is_committed(tmp_path):
    steps, status, saved = _run_failing(tmp_path, "local", **{"checkpoint.every": 0})
    assert steps == [0] and status == ["failed"] and saved == []


def test_no_checkpoint_follows_a_failed_commit(tmp_path):
    steps, status, saved = _run_failing(tmp_path, "local", **{"checkpoint.every": 1})
    assert steps == [0] and status == ["failed"] and saved == [0]


def test_a_failed_commit_fails_the_prefect_flow(tmp_path, prefect_server):
    steps, status, saved = _run_failing(tmp_path, "prefect", **{"checkpoint.every": 0})
    assert steps == [0] and status == ["failed"] and saved == []
