"""``gfcr run``'s engine room: run a request through the gfcr flow (or in-process).

With the Prefect executor ``gfcr run`` calls the module-level flow
:func:`gfcr.launch.flow.pipeline_flow`, the one a deployment runs on a worker; with
``--executor local`` it runs the same request without Prefect, which it does not even
import (gfcr.launch.request). Either way the first
Ctrl-C or SIGTERM stops the run at the next step boundary (:mod:`gfcr.checkpoints.cancel`) and this
raises :class:`~gfcr.checkpoints.cancel.RunCancelled`; a second one stops at once
(KeyboardInterrupt).
"""

from __future__ import annotations

import inspect
import signal
from typing import Callable, Protocol, Sequence

from gfcr.commands.exits import RunExited, unfinished_exits_fail
from gfcr.launch.hooks import RunSummary
from gfcr.launch.request import Launch, RunRequest, extra_hooks, run_request, settled
from gfcr.checkpoints.cancel import RunCancelled, Stop, on_signals
from gfcr.transport.executors import Executor, PrefectExecutor, named


def run(launch: Launch, executor: str, *, hooks: Sequence[object],
        notify: Callable[[str], None]) -> RunSummary:
    """The RunSummary of ``launch`` (a request resolved once: gfcr.launch.request);
    raises RunCancelled when it was stopped at a step boundary, RunExited when code it
    ran exited (an ``os._exit(0)`` exits with gfcr.commands.exits.UNFINISHED), and what
    the run raised when it failed."""
    with unfinished_exits_fail():
        try:
            return _run(launch, named(executor), hooks=hooks, notify=notify)
        except SystemExit as exc:  # code the run called exited: the run did not finish
            raise RunExited(f"the run did not finish: code it ran called exit({exc.code!r}); "
                            f"continue with: gfcr run --resume {launch.run_id}") from exc


def _run(launch: Launch, chosen: Executor, *, hooks: Sequence[object],
         notify: Callable[[str], None]) -> RunSummary:
    if isinstance(chosen, PrefectExecutor):
        return _in_flow(settled(launch), hooks)
    stop = Stop(notify=notify)
    with on_signals(stop, last=True):
        try:
            return run_request(launch.request, chosen, stop=stop, hooks=tuple(hooks),
                               launch=launch)
        except Exception as exc:  # what the second signal interrupted raised, or the end
            if stop.at_once:      # at the boundary it reached meanwhile: stopped at once
                raise KeyboardInterrupt(f"stopped at once ({type(exc).__name__})") from exc
            raise


class Console(Protocol):
    """Where ``gfcr run`` speaks (a rich Console)."""

    def print(self, *objects: object) -> None: ...


def stopping(console: Console) -> Callable[[str], None]:
    """What ``gfcr run`` says on ``console`` when asked to stop (gfcr.checkpoints.cancel)."""
    return lambda why: console.print(
        f"{why}: stopping after the step under way (again to stop at once)")


def _in_flow(request: RunRequest, hooks: Sequence[object]) -> RunSummary:
    from gfcr.launch.flow import pipeline_flow  # Prefect: imported only for its executor

    _shielded_temporary_server()
    token = extra_hooks.set(tuple(hooks))
    try:
        named_flow = pipeline_flow.with_options(flow_run_name=request.run_id)
        state = named_flow(request=request, return_state=True)
        # a sync flow called with return_state gives its State (never an awaitable here)
        assert not inspect.isawaitable(state)
    finally:
        extra_hooks.reset(token)
    if state.is_cancelled():
        raise RunCancelled(state.message or f"run {request.run_id!r} cancelled",
                           run_id=request.run_id or "")
    summary = state.result()
    assert isinstance(summary, RunSummary)  # a finished flow returns the run's summary
    return summary


def _shielded_temporary_server() -> None:
    """Start Prefect's temporary server (used when no PREFECT_API_URL is set) with SIGINT
    blocked, a mask the server process inherits. A terminal's Ctrl-C goes to the whole
    foreground process group; without this it also stopped the server, so the run, which
    stops at its next step boundary, could no longer record its state in Prefect and the
    command ended in a connection error. Prefect stops the server with SIGTERM at exit;
    a watcher stops it when this process dies otherwise (gfcr.transport.reaper)."""
    from prefect.settings import PREFECT_API_URL

    if PREFECT_API_URL.value():  # a real server: nothing of ours to shield
        return
    from prefect.server.api.server import SubprocessASGIServer

    from gfcr.transport.reaper import dies_with_this_process

    before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        with dies_with_this_process():  # kill -9 of this process included
            SubprocessASGIServer().start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)
