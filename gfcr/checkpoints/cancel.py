"""Stopping a run cleanly: at the next step boundary, with a checkpoint, ended Cancelled.

A :class:`Stop` is a run's stop request. Whoever wants the run to end sets it: the first
Ctrl-C or SIGTERM (:func:`on_signals`; a Prefect worker cancels a flow run by sending
SIGTERM to its process), or a watcher that sees the flow run cancelled in the Prefect
API (:mod:`gfcr.launch.flow`). The loop looks at it between steps: the step under way finishes,
its commit finishes, a checkpoint of the last whole step is written, the store records
the run ``cancelled`` and the run raises :class:`RunCancelled`. ``--resume`` continues it
with no step missing or stored twice (:mod:`gfcr.checkpoints.resume`).

A second Ctrl-C or SIGTERM stops at once (KeyboardInterrupt): the commit in flight still
finishes (the body waits for it), so at most the step under way is lost, and a resume
runs it again from the last checkpoint, replaying any committed step after it. Code that
is interrupted may turn the KeyboardInterrupt into its own error (DuckDB raises "Query
interrupted"); :attr:`Stop.at_once` says the stop was asked for, so the run still ends
cancelled rather than failed. Once the run is recording its end (:attr:`Stop.ending`) a
second signal interrupts nothing: that record takes milliseconds and must be whole.
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Callable, Iterator


class Stop:
    """A request to stop a run at its next step boundary; set once, by whoever asks first."""

    def __init__(self, notify: Callable[[str], None] | None = None) -> None:
        self._event = threading.Event()
        self._notify = notify
        self.reason = ""
        self.at_once = False  # a second request came: stop now, not at the boundary
        self.ending = False
        """The run is recording its end (the commit in flight, its status): a second
        signal then marks ``at_once`` but interrupts nothing, so the record is whole."""

    def request(self, reason: str) -> None:
        """Ask the run to stop after the step under way; ``reason`` says who asked."""
        if self._event.is_set():
            return
        self.reason = reason
        self._event.set()
        if self._notify is not None:
            self._notify(reason)

    @property
    def requested(self) -> bool:
        return self._event.is_set()

    def wait(self, seconds: float) -> bool:
        """Wait up to ``seconds`` for a request; whether one came."""
        return self._event.wait(seconds)


class RunCancelled(Exception):
    """A run stopped on request at a step boundary; it can be resumed. The message says
    where it stopped and how to go on."""

    def __init__(self, message: str, *, run_id: str = "", last_step: int | None = None,
                 checkpoint: Path | None = None) -> None:
        super().__init__(message)
        self.run_id = run_id
        self.last_step = last_step
        self.checkpoint = checkpoint


def cancelled(run_id: str, *, last_step: int | None, checkpoint: Path | None,
              reason: str) -> RunCancelled:
    """The RunCancelled of ``run_id``, stopped after ``last_step`` for ``reason``."""
    done = ("before its first step" if last_step is None
            else f"after step {last_step} (steps 0-{last_step} are stored)")
    saved = f"; checkpoint {checkpoint}" if checkpoint is not None else ""
    return RunCancelled(f"run {run_id!r} cancelled ({reason}) {done}{saved}. Continue it "
                        f"with --resume {run_id}", run_id=run_id, last_step=last_step,
                        checkpoint=checkpoint)


@contextmanager
def on_signals(stop: Stop, *, last: bool = False) -> Iterator[None]:
    """While inside: the first SIGINT or SIGTERM requests ``stop``; a second one raises
    KeyboardInterrupt at once. Outside the main thread (where Python cannot catch
    signals) it does nothing. The handlers before are put back on exit, except with
    ``last`` (the process ends with the run: ``gfcr run``) once a stop was requested: a
    second signal that comes after the run has stopped then has nothing left to stop and
    is ignored, where Python's own handler would abort the command's last words."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    watched = (signal.SIGINT, signal.SIGTERM)

    def handler(signum: int, frame: FrameType | None) -> None:
        if stop.requested:
            stop.at_once = True
            if stop.ending:
                return
            raise KeyboardInterrupt(f"second {signal.Signals(signum).name}: stopping at once")
        stop.request(f"{signal.Signals(signum).name} received")

    previous = {sig: signal.signal(sig, handler) for sig in watched}
    try:
        yield
    finally:
        if last and stop.requested:
            stop.ending = True  # our handler stays: it marks a later signal, raises nothing
        else:
            for sig, old in previous.items():
                signal.signal(sig, old)
