"""Calls into user code under a time limit, on a reused helper thread.

A stage that calls code it does not trust to return (a user's scorer) runs each call on
a helper thread and waits at most ``timeout``: an in-process call cannot be killed, so a
call past its limit is left running on its (daemon) helper, and the next call gets a new
one. The helper is reused between calls, one per calling thread: starting a thread per
call cost the default pipeline's verifier 256 thread starts a step.

The CPU a helper spends on a call is charged to whoever is collecting it on the calling
thread (:func:`charging`): the loop's stage clock does, so a stage's CPU includes the
work it handed to helpers (gfcr.loop.StageClock).
"""

from __future__ import annotations

import queue
import threading
import time
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Callable, Iterator

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


class _Helper:
    """One daemon thread running the calls put to it, in order."""

    def __init__(self) -> None:
        self.calls: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        threading.Thread(target=self._serve, daemon=True, name="gfcr-helper").start()

    def _serve(self) -> None:
        while True:
            self.calls.get()()


def call_with_timeout(fn: Callable[[], None], timeout: float) -> bool:
    """Run ``fn()`` on this thread's helper; False if it ran past ``timeout`` seconds
    (it goes on running there, and the helper is replaced). ``fn`` reports its own
    errors: one that escapes it is dropped, so that the helper lives on."""
    helper: _Helper | None = getattr(_local, "helper", None)
    if helper is None:
        helper = _local.helper = _Helper()
    box, done = _charged.get(), threading.Event()

    def run() -> None:
        cpu = time.thread_time()
        try:
            fn()
        except BaseException:  # noqa: BLE001 - keep the helper alive; fn reports its own
            pass
        finally:
            if box is not None:
                box[0] += time.thread_time() - cpu
            done.set()

    helper.calls.put(run)
    if done.wait(timeout):
        return True
    _local.helper = None  # busy past its limit: the next call starts a new helper
    return False
