"""Calling user code (environments) side by side, each call under a time limit.

An environment step may run a sandboxed tool (a second or more), so a wave's calls run
concurrently, ``workers`` at a time, each in a daemon thread of its own. A call still
running at its deadline is recorded as timed out and abandoned: Python cannot kill a
thread, so a hung environment keeps its thread (and nothing else) until the process
ends; the episode it belonged to is over, and the run goes on.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Callable


@dataclass
class CallOutcome:
    """How one call ended: its value, or the error it raised, or a timeout."""

    value: Any = None
    error: BaseException | None = None
    timed_out: bool = False


def call_all(calls: list[Callable[[], Any]], *, timeout: float, workers: int) -> list[CallOutcome]:
    """Run ``calls``, ``workers`` at a time, each allowed ``timeout`` seconds; outcomes in
    call order. Never raises for what a call does."""
    out = [CallOutcome() for _ in calls]
    for start in range(0, len(calls), max(1, workers)):
        chunk = range(start, min(len(calls), start + max(1, workers)))
        threads = {i: _start(calls[i], out[i]) for i in chunk}
        deadline = time.monotonic() + timeout
        for i, (thread, done) in threads.items():
            thread.join(max(0.0, deadline - time.monotonic()))
            if not done.is_set():
                out[i] = CallOutcome(timed_out=True)  # abandoned: its result is never read
    return out


def _start(fn: Callable[[], Any], slot: CallOutcome) -> tuple[threading.Thread, threading.Event]:
    done = threading.Event()

    def run() -> None:
        try:
            slot.value = fn()
        except BaseException as err:  # noqa: BLE001 - user code: recorded, never raised
            slot.error = err
        finally:
            done.set()

    thread = threading.Thread(target=run, name="gfcr-env-call", daemon=True)
    thread.start()
    return thread, done
