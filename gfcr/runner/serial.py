"""Calls a generator runs behind its caller: on one thread of their own, in the order
submitted (gfcr.runner.inprocess.LocalGenerator, gfcr.transport.fleet.FleetGenerator),
or at once on the caller's thread when nothing runs in the background."""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

from gfcr.core.services import Done, Pending


class SerialCalls:
    """One worker thread (``background``) or none: ``run`` returns a pending result."""

    def __init__(self, *, background: bool, name: str) -> None:
        self._pool = ThreadPoolExecutor(1, thread_name_prefix=name) if background else None
        self._futures: list[Future] = []

    @property
    def background(self) -> bool:
        return self._pool is not None

    def run(self, fn: Callable[[], Any]) -> Pending:
        """``fn`` after every call submitted before it (now, without a thread)."""
        if self._pool is None:
            return Done(fn())
        self._futures = [f for f in self._futures if not f.done()]
        future = self._pool.submit(fn)
        self._futures.append(future)
        return future

    def busy(self) -> bool:
        """Whether a call submitted is still running or queued."""
        self._futures = [f for f in self._futures if not f.done()]
        return bool(self._futures)

    def drain(self) -> None:
        """Wait until nothing submitted is still running (their errors stay with their
        pending results)."""
        for future in self._futures:
            future.exception()
        self._futures = []

    def close(self) -> None:
        """Stop the thread; calls not started yet are dropped."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
