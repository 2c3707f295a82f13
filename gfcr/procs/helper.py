"""Calls into user code under a time limit, on a reused helper thread.

A stage that calls code it does not trust to return (a user's scorer) runs each call on
a helper thread and waits at most ``timeout``. An in-process call cannot be killed, so a
call past its limit is left running on its (daemon) helper, and the helper takes no new
call until it returns: the caller is told at once that the helper is busy, and decides
(gfcr's Verify counts it as a failure, and its circuit breaker stops the step's scoring).
So a hanging callee holds one thread per calling thread, and no thread is leaked per call.
The helper is reused between calls, one per calling thread: starting a thread per call
cost the default pipeline's verifier 256 thread starts a step.

The CPU a helper spends on a call is charged to whoever is collecting it on the calling
thread (:func:`charging`): the loop's stage clock does, so a stage's CPU includes the
work it handed to helpers (gfcr.runner.loop.StageClock).
"""

from __future__ import annotations

import queue
import threading
import time
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Callable, Iterator, Literal

_charged: ContextVar[list[float] | None] = ContextVar("gfcr_helper_cpu", default=None)
_local = threading.local()


@contextmanager
def charging() -> Iterator[list[float]]:
    """Within the block, helpers add the CPU seconds of this thread's calls to the
    one-element list yielded."""
    box = [0.0]
    token = _charged.set(box)
    try:
        yield box
    finally:
        _charged.reset(token)


Outcome = Literal["done", "timeout", "busy"]
"""How :func:`call_with_timeout` went: the call returned in time, ran past its limit
(it goes on running), or was not made because an earlier one is still running."""


class _Helper:
    """One daemon thread running the calls put to it, one at a time."""

    def __init__(self) -> None:
        self.calls: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self.idle = threading.Event()
        self.idle.set()
        threading.Thread(target=self._serve, daemon=True, name="gfcr-helper").start()

    def _serve(self) -> None:
        while True:
            self.calls.get()()


def _helper() -> _Helper:
    """This thread's helper, started on first use."""
    # getattr: thread-local slot, unset until this thread starts one
    helper: _Helper | None = getattr(_local, "helper", None)
    if helper is None:
        helper = _local.helper = _Helper()
    return helper


def call_with_timeout(fn: Callable[[], None], timeout: float) -> Outcome:
    """Run ``fn()`` on this thread's helper and wait at most ``timeout`` seconds.

    A call past its limit goes on running on the helper, and until it returns, every
    call from this thread answers ``"busy"`` at once without running: a callee that
    hangs holds one thread for as long as it hangs, never one more per call. ``fn``
    reports its own errors: one that escapes it is dropped, so that the helper lives on."""
    helper = _helper()
    if not helper.idle.is_set():
        return "busy"
    box, done = _charged.get(), threading.Event()
    helper.idle.clear()

    def run() -> None:
        cpu = time.thread_time()
        try:
            fn()
        except BaseException:  # noqa: BLE001 - keep the helper alive; fn reports its own
            pass
        finally:
            if box is not None:
                box[0] += time.thread_time() - cpu
            helper.idle.set()  # before done: a caller told "done" finds the helper idle
            done.set()

    helper.calls.put(run)
    return "done" if done.wait(timeout) else "timeout"


def charge(seconds: float) -> None:
    """Add ``seconds`` of CPU spent elsewhere for this thread (a scorer worker process's,
    :mod:`gfcr.procs.scorer_workers`) to whoever is collecting it (:func:`charging`)."""
    box = _charged.get()
    if box is not None:
        box[0] += seconds
