"""Scorers cannot freeze or end the run (issue 26, item 1): a scorer that may run long runs
in a worker process that is killed at its deadline, and one that ends its own process is
that rollout's recorded failure.

The attacks run in a child Python process: on code without the workers they freeze the
interpreter (a computation that never lets go of the GIL) or end it with exit code 0,
which inside pytest would hang the suite or end it looking green. The child imports only
what Verify needs (``stages`` entered lazily, gfcr.procs.childproc), so each takes seconds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.resources.procs import running

ROOT = Path(__file__).resolve().parents[3]
_PRELUDE = """
import json
from gfcr.procs.childproc import lazy_package
lazy_package("stages")
from stages.filter.verify import Verify
from tests.resources.rollouts import context, rollouts

def show(result):
    t = result.table
    print(json.dumps({c: t.column(c).to_pylist()
                      for c in ("reward", "score_error", "score_isolation")}))
"""


def _isolated(code: str, timeout: float = 240.0) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}
    try:
        return subprocess.run([sys.executable, "-c", _PRELUDE + textwrap.dedent(code)],
                              cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the scoring process was still running after {timeout:.0f} s: the "
                    f"scorer froze it")


def _shown(proc: subprocess.CompletedProcess[str]) -> dict:
    lines = proc.stdout.strip().splitlines()
    assert proc.returncode == 0 and lines, (proc.returncode, proc.stdout, proc.stderr[-2000:])
    return json.loads(lines[-1])


def test_a_scorer_that_holds_the_gil_is_killed_at_its_timeout():
    """math-verify expanding 9^9^9^9 computes in C, holding the GIL: the call is killed at
    its timeout, recorded as a TimeoutError, and the other rollouts are still scored."""
    proc = _isolated(r"""
        table = rollouts(["g"] * 3, answer=["42"] * 3,
                         completion=[r"\boxed{9^{9^{9^{9}}}}", r"\boxed{42}", r"\boxed{41}"])
        show(Verify(scorer="math", timeout=2.0).apply(context(), table))
    """)
    shown = _shown(proc)
    assert shown["score_error"][0].startswith("TimeoutError: scorer ran past its limit of 2s")
    assert shown["score_error"][1:] == [None, None]
    assert shown["reward"][1:] == [1.0, 0.0]
    assert shown["score_isolation"] == ["worker"] * 3


def test_a_scorer_that_ends_its_own_process_is_a_recorded_failure():
    """os._exit(0), a segfault, SIGKILL to itself or to its process group: each is that
    rollout's scorer failure, saying how the scorer's process ended; the step goes on. On
    every rollout, it ends the run with ScorerFailed (exit code 1 from gfcr run), never
    with the scorer's exit code 0."""
    proc = _isolated("""
        from stages.filter.verify import ScorerFailed
        stage = Verify(scorer="tests.resources.hostile_scorers:ends_its_process", timeout=30.0)
        try:
            stage.apply(context(), rollouts(["g"] * 3, completion=["exit"] * 3))
        except ScorerFailed as err:
            print(err)
        table = rollouts(["g"] * 5, completion=["exit", "segfault", "kill", "killpg", "fine"])
        show(stage.apply(context(), table))
    """)
    errors = _shown(proc)["score_error"]
    assert "the scorer failed on all 3 rollouts" in proc.stdout
    assert "ended (exit code 0)" in errors[0]
    assert "ended (killed by signal SIGSEGV)" in errors[1]
    assert all("ended (killed by signal SIGKILL)" in e for e in errors[2:4])
    assert errors[4] is None


def test_a_scorer_worker_ends_with_the_runs_process():
    """kill -9 of the run while its scorer hangs: the worker goes with it, not on alone."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}
    code = _PRELUDE + textwrap.dedent("""
        stage = Verify(scorer="tests.resources.hostile_scorers:tells_its_pid_and_hangs",
                       timeout=600.0)
        stage.apply(context(), rollouts(["g"]))
    """)
    run = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env,
                           stdout=subprocess.PIPE, text=True)
    try:
        line = run.stdout.readline()
        assert line.startswith("scorer pid "), line
        worker = int(line.split()[-1])
    finally:
        run.kill()
        run.wait()
    deadline = time.monotonic() + 60
    while running(worker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not running(worker)
