"""User scorers that attack the process they run in: they end it, crash it or signal it
(tests/stages/filter/test_scorer_workers.py)."""

from __future__ import annotations

import ctypes
import os
import signal


def ends_its_process(completion: str, answer: str | None, meta: str | None) -> float:
    """Scores 1, except that the completions ``exit``, ``segfault``, ``kill`` and
    ``killpg`` end the scorer's process: ``os._exit(0)``, a null read, SIGKILL to itself,
    SIGKILL to its process group."""
    if completion == "exit":
        os._exit(0)
    if completion == "segfault":
        ctypes.string_at(0)
    if completion == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if completion == "killpg":
        os.killpg(0, signal.SIGKILL)
    return 1.0


def tells_its_pid_and_hangs(completion: str, answer: str | None, meta: str | None) -> float:
    """Prints its process id, then hangs for ten minutes."""
    import time

    print(f"scorer pid {os.getpid()}", flush=True)
    time.sleep(600)
    return 1.0
