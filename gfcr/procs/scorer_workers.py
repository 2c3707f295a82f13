"""Scorer worker processes: scorer calls that the run can kill at their deadline.

An in-process call cannot be stopped (:mod:`gfcr.procs.helper`), and a scorer that computes
in C without letting go of the GIL (math-verify asked to expand ``9^{9^{9^{9}}}``) stops
every thread of the run with it, timeouts and the lease renewer included. So a scorer
that may run long is called in a worker process: the run sends the call, waits for the
answer until the call's deadline, and past it kills the worker (and whatever it started)
and starts a fresh one for the next call. A worker that dies on its own (``os._exit``, a
segfault, a signal) is an answer too: the call failed, saying how the worker ended. The
run's process never runs the scorer, so nothing the scorer does can end or freeze it.

Workers are persistent: one per calling thread at a time, kept idle between calls and
steps, each loading a scorer once (:class:`Payload`: the pickled scorer, sent once per
worker) and then taking calls. Starting and loading have their own deadline (``ready``:
the step's budget left), not the call's, so a worker's imports never count as a slow
call; a loaded scorer with a ``warm()`` method has it run then too. Answers come back as
JSON (a value or an error), never as a pickle, so a worker cannot hand the run an object.
The workers are started by :mod:`gfcr.procs.childproc` (light imports, ended with the run), and
each offers itself first to the kernel's out-of-memory killer, so that a scorer sent into a
huge computation takes itself down rather than the trainer.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import pickle
import threading
from dataclasses import dataclass
from time import monotonic
from typing import Any, Literal

from gfcr.procs import childproc, wire

_CAP = 1 << 20
"""The largest answer a worker may send (bytes)."""
_LAZY = ("stages", "store")
"""Packages whose ``__init__`` a worker skips (every operator, the whole store)."""
_IDLE = 4
"""Idle workers kept at most."""


@dataclass(frozen=True)
class Payload:
    """A scorer as sent to workers: its pickle, and that pickle's hash (a worker loads
    each scorer once)."""

    key: str
    blob: bytes


def payload(scorer: Any) -> Payload:
    """``scorer`` ready to send; ValueError when it cannot be pickled (a lambda, a
    function defined in ``__main__``, an object holding a lock)."""
    if getattr(scorer, "__module__", None) == "__main__":
        raise ValueError(f"scorer {scorer!r} is defined in __main__, which a worker process "
                         f"cannot import: define it in a module")
    try:
        blob = pickle.dumps(scorer)
    except Exception as err:  # noqa: BLE001 - pickling raises many types
        raise ValueError(f"scorer {scorer!r} cannot be sent to a worker process "
                         f"({type(err).__name__}: {err})") from None
    return Payload(hashlib.sha256(blob).hexdigest(), blob)


@dataclass(frozen=True)
class Reply:
    """How one call went. ``done``: the scorer returned ``value`` or raised (``error``,
    with its exception's qualified ``error_type``); ``timeout``: the call ran past its
    deadline and its worker was killed; ``died``: the worker ended during the call."""

    outcome: Literal["done", "timeout", "died"]
    value: float | None = None
    error: str | None = None
    error_type: str | None = None
    cpu: float = 0.0
    """CPU seconds the worker spent on the call."""


class _Worker:
    """One worker process and the two pipes to it."""

    def __init__(self) -> None:
        self.proc, self._send, self._answers = childproc.spawn_piped(
            "gfcr.procs._scorer_child", [], lazy=_LAZY)
        os.set_blocking(self._send, False)
        self.loaded: set[str] = set()
        self._closed = False

    def alive(self) -> bool:
        return childproc.running(self.proc)

    def ask(self, message: tuple[Any, ...], deadline: float) -> dict[str, Any]:
        """Send ``message`` and wait for its answer until ``deadline``."""
        wire.write_frame(self._send, pickle.dumps(message), deadline)
        answer = json.loads(wire.read_frame(self._answers, deadline, _CAP, self.alive))
        if not isinstance(answer, dict):
            raise ValueError(f"an answer that is not an object: {answer!r:.100}")
        return answer

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        childproc.kill_piped(self.proc, self._send, self._answers)


class ScorerWorkers:
    """Idle workers, taken one per call (so concurrent calls never share one)."""

    def __init__(self) -> None:
        self._idle: list[_Worker] = []
        self._lock = threading.Lock()

    def call(self, scorer: Payload, args: tuple[Any, ...], *, timeout: float,
             ready: float) -> Reply:
        """Call ``scorer(*args)`` in a worker: at most ``timeout`` seconds for the call
        itself, and at most ``ready`` seconds in all, starting a worker and loading the
        scorer included."""
        worker = self._take()
        try:
            reply = _call(worker, scorer, args, timeout, ready)
        except BaseException:
            worker.close()
            raise
        if reply.outcome == "done":
            self._give(worker)
        else:
            worker.close()
            self._give(_Worker())  # a fresh one starts now, ready by the next call
        return reply

    def close(self) -> None:
        """End every idle worker."""
        with self._lock:
            idle, self._idle = self._idle, []
        for worker in idle:
            worker.close()

    def _take(self) -> _Worker:
        with self._lock:
            while self._idle:
                worker = self._idle.pop()
                if worker.alive():
                    return worker
                worker.close()
        return _Worker()

    def _give(self, worker: _Worker) -> None:
        with self._lock:
            if len(self._idle) < _IDLE:
                self._idle.append(worker)
                return
        worker.close()


def _call(worker: _Worker, scorer: Payload, args: tuple[Any, ...], timeout: float,
          ready: float) -> Reply:
    until = monotonic() + ready
    if scorer.key not in worker.loaded:
        loaded = _ask(worker, ("load", scorer.key, scorer.blob), until,
                      f"TimeoutError: the scorer's worker process was not ready within "
                      f"{ready:.3g}s (starting, importing the scorer)")
        if loaded.outcome != "done" or loaded.error is not None:
            return loaded
        worker.loaded.add(scorer.key)
    limit = min(timeout, until - monotonic())
    return _ask(worker, ("score", scorer.key, args), monotonic() + limit,
                f"TimeoutError: scorer ran past its limit of {limit:.3g}s "
                f"(its worker process was killed)")


def _ask(worker: _Worker, message: tuple[Any, ...], deadline: float, late: str) -> Reply:
    try:
        answer = worker.ask(message, deadline)
    except TimeoutError:
        return Reply("timeout", error=late)
    except wire.PeerGone:
        worker.close()
        return Reply("died", error=f"ScorerDied: the scorer's worker process ended "
                                   f"({childproc.how_it_ended(worker.proc)}) during the call")
    except ValueError as err:  # unreadable or too large (wire.TooLarge): not to be trusted
        return Reply("died", error=f"ScorerDied: the scorer's worker process answered "
                                   f"nonsense ({err})"[:500])
    value = answer.get("value")
    return Reply("done", value=None if value is None else float(value),
                 error=answer.get("error"), error_type=answer.get("type"),
                 cpu=float(answer.get("cpu") or 0.0))


_pool: ScorerWorkers | None = None
_pool_lock = threading.Lock()


def pool() -> ScorerWorkers:
    """This process's worker pool (ended when the process exits)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ScorerWorkers()
        return _pool


@atexit.register
def _close() -> None:
    if _pool is not None:
        _pool.close()


def _forget() -> None:
    """In a forked child: the parent's workers are the parent's (their pipes are shared);
    the child starts its own when it needs one."""
    global _pool, _pool_lock
    _pool, _pool_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget)
