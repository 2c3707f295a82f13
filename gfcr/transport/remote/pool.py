"""Sending a score call to a pool and waiting for it, bounded.

:class:`PoolCalls` signs each call with the pool's key (gfcr.transport.remote.keys), submits it with
``.delay()`` and waits for its result within one deadline, ``timeout_s`` from the
moment the run starts waiting for it, whatever happens in between:

- no worker takes it: a warning after ``warn_s``, :class:`NoEngineWorker` naming the pool
  at the deadline;
- its worker stops beating for ``lost_s`` (judged by this process's own clock: the time
  the heartbeat file last changed as seen here, so hosts need not agree on the time; an
  output already in place is never lost): sent again, at most ``attempts`` sendings in
  all, then :class:`LostCall`; an attempt superseded is withdrawn (gfcr.transport.remote.guard);
- it stays queued while a worker subscribed to its task sits idle: Prefect keeps its
  queue of background task runs in the API process's memory, and a server restart loses
  it (issue 21 D4), so it is sent once more, saying so; lost again, the deadline's error
  says that workers were there and what lost the call.

A call given up, superseded or dropped is withdrawn: a marker beside its output that the
worker reads before it runs and before it writes, its queued task run deleted and a
running one marked Cancelled. :meth:`PoolCalls.collect` removes a finished call's files.
"""

from __future__ import annotations

import contextvars
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field, field_validator

from gfcr.transport.remote.call import check_pool, read_parquet
from gfcr.transport.remote.guard import WITHDRAWN
from gfcr.transport.remote.keys import load_key, sign
from gfcr.transport.remote.worker import BEAT, pool_tag

KIND = "score"
"""The kind a call is signed as (gfcr.transport.remote.keys): pools serve score calls only."""


class NoEngineWorker(TimeoutError):
    """No worker of the pool (``gfcr engine-worker``) took a call within the timeout."""

    gfcr_retry = False  # a retry would wait the whole timeout again (gfcr.transport.executors)


class LostCall(RuntimeError):
    """A call lost its worker on every one of its attempts."""

    gfcr_retry = False  # the attempts were the retries


class WorkerPool(BaseModel):
    """Where a run's scoring filter stages run: on the workers of ``pool``
    (``gfcr engine-worker --pool POOL``; ``gfcr run --score-pool POOL``).

    A run option, not a pipeline field: it says where the work runs, not what it is, so
    the same pipeline (and spec hash) gives the same scores in-process or on workers."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    pool: str
    timeout_s: float = Field(600.0, gt=0)
    """Fail a call that no worker finished within this many seconds of its first sending."""
    warn_s: float = Field(10.0, ge=0)
    """Say that the run waits for a worker once a call is queued this long."""
    lost_s: float = Field(30.0, gt=0)
    """A running call whose worker's heartbeat has not changed for this long is sent
    again (a worker killed mid-task); the step uses whichever attempt finishes."""
    attempts: int = Field(3, ge=1)
    """Sendings of one call at most, its first included."""
    key_file: str | None = None
    """The pool's key (gfcr.transport.remote.keys); None: the file GFCR_POOL_KEY_FILE names."""

    @field_validator("pool")
    @classmethod
    def _pool(cls, value: str) -> str:
        return check_pool(value)


@dataclass
class _Sent:
    """A call sent to a pool: its task run, and the table it was sent with."""

    call: Any
    """A ScoreCall (gfcr.transport.remote.call)."""
    future: Any
    rows: pa.Table
    """The call's input table (the rows to score)."""
    sent: float
    delay_s: float
    """Seconds ``.delay()`` took (creating the task run, storing its parameters)."""
    first: float | None = None
    """When the run first waited for the call (this process's clock): its deadline
    counts from it."""
    at: float = field(default_factory=time.monotonic)
    """When this attempt was sent."""
    attempt: int = 1
    requeued: bool = False
    """Sent again because Prefect's queue lost it (once per call)."""
    superseded: list[Any] = field(default_factory=list)
    """Earlier attempts (call, future), withdrawn."""
    beat: tuple[float, float] | None = None
    """(heartbeat mtime, when this process saw it change)."""
    asked: float = 0.0
    """When the run last asked whether a worker of the pool sits idle."""


class PoolCalls:
    """Sends score calls to a pool's Prefect task and waits for each (see the module).
    ``task(pool)`` is the pool's task (gfcr.transport.remote.worker.score_task)."""

    def __init__(self, placement: WorkerPool, task: Callable[[str], Any],
                 notify: Callable[[str], None]) -> None:
        self.placement, self.task, self.notify = placement, task, notify
        self.key = load_key(placement.key_file)  # refused here, before any work

    def send(self, call: Any, inputs: pa.Table, started: float) -> _Sent:
        """Submit ``call`` (whose input table is already staged) with ``.delay()``; it
        expires for the workers at its deadline."""
        delaying = time.perf_counter()
        call = call.model_copy(update={"expires": time.time() + self.placement.timeout_s})
        mac = sign(KIND, call, self.key)
        future = _outside_runs(lambda: self.task(self.placement.pool).delay(
            name=call.name, call=call.model_dump(mode="json"), mac=mac))
        return _Sent(call, future, inputs, started, time.perf_counter() - delaying)

    def collect(self, sent: _Sent) -> tuple[dict[str, Any], pa.Table]:
        """Wait for ``sent`` (:meth:`wait`); its report and output, its files removed."""
        report = self.wait(sent)
        table = read_parquet(report["out"])
        for path in (sent.call.rows, sent.call.out, sent.call.out + BEAT):
            Path(path).unlink(missing_ok=True)
        return report, table

    def wait(self, sent: _Sent) -> dict[str, Any]:
        """The call's result within the deadline (see the module); ``sent`` is updated
        to the attempt that finished."""
        from prefect import get_client

        name, limit = sent.call.name, self.placement.timeout_s
        warned, sent.first = False, sent.first or time.monotonic()
        first = sent.first
        with get_client(sync_client=True) as client:
            while True:
                state = client.read_task_run(sent.future.task_run_id).state
                if state is not None and state.is_final():
                    report = dict(sent.future.result())
                    self._withdraw_superseded(client, sent)
                    return report
                now = time.monotonic()
                queued = state is None or state.is_scheduled() or state.is_pending()
                if not queued and self._lost(sent, now):
                    self._again(client, sent, f"{name}: the engine worker of pool "
                                f"{self.placement.pool!r} running it stopped signalling "
                                f"for {self.placement.lost_s:g} s")
                    continue
                if state is not None and state.is_scheduled() and not sent.requeued and \
                        now - sent.at >= self.placement.warn_s and self._idle(client, sent, now):
                    sent.requeued = True
                    self._again(client, sent, f"{name}: an engine worker of pool "
                                f"{self.placement.pool!r} is idle but never received the "
                                "call (Prefect's in-memory task queue lost it: a server "
                                "restart?)")
                    continue
                if now - first >= limit:
                    self._give_up(client, sent, queued)
                if queued and not warned and now - sent.at >= self.placement.warn_s:
                    warned = True
                    self.notify(f"{name}: waiting for an engine worker of pool "
                                f"{self.placement.pool!r} (none has taken the call for "
                                f"{now - sent.at:.0f} s; failing {limit:g} s after the "
                                "run began waiting for it)")
                if state is None or not _waited(sent.future, limit - (now - first)):
                    time.sleep(0.2)  # between Prefect's events and its API: ask again

    def _lost(self, sent: _Sent, now: float) -> bool:
        """Whether the attempt's worker stopped its heartbeat: the beat file has not
        changed for ``lost_s`` as seen here (none yet: counted from the sending)."""
        if Path(sent.call.out).exists():
            return False  # written: only Prefect's bookkeeping is left
        beat = Path(sent.call.out + BEAT)
        try:
            mtime = beat.stat().st_mtime
        except FileNotFoundError:
            return now - sent.at > self.placement.lost_s
        if sent.beat is None or sent.beat[0] != mtime:
            sent.beat = (mtime, now)
        return now - sent.beat[1] > self.placement.lost_s

    def _again(self, client: Any, sent: _Sent, why: str) -> None:
        """Send ``sent``'s call once more (``sent`` becomes the new attempt), withdrawing
        the old one; LostCall when it was sent ``attempts`` times."""
        if sent.attempt >= self.placement.attempts:
            self.withdraw(client, sent.call, sent.future)
            raise LostCall(f"{why}; it was sent {sent.attempt} times (the pool's "
                           f"attempts), so the run stops here")
        self.notify(f"{why}; sending the call again (attempt {sent.attempt + 1} of "
                    f"{self.placement.attempts})")
        old_call, old_future = sent.call, sent.future
        first = re.sub(r"-attempt\d+$", "", Path(old_call.out).name.removesuffix(".parquet"))
        out = str(Path(old_call.out).with_name(f"{first}-attempt{sent.attempt + 1}.parquet"))
        again = self.send(old_call.model_copy(update={"out": out}), sent.rows, sent.sent)
        sent.superseded.append((old_call, old_future))
        self.withdraw(client, old_call, old_future)
        sent.call, sent.future, sent.delay_s = again.call, again.future, again.delay_s
        sent.at, sent.attempt, sent.beat = time.monotonic(), sent.attempt + 1, None

    def _idle(self, client: Any, sent: _Sent, now: float) -> bool:
        """Whether more workers are subscribed to the call's task than the pool has
        calls taken (pending or running): one is idle, yet the call waits. Asked at most
        every few seconds."""
        from prefect.client.schemas.filters import (TaskRunFilter, TaskRunFilterState,
                                                    TaskRunFilterStateType, TaskRunFilterTags)
        from prefect.client.schemas.objects import StateType

        if now - sent.asked < max(self.placement.warn_s, 5.0):
            return False
        sent.asked = now
        key = client.read_task_run(sent.future.task_run_id).task_key
        answer = client.request("POST", "/task_workers/filter",
                                json={"task_worker_filter": {"task_keys": [key]}})
        workers = len(answer.json())
        if workers == 0:
            return False
        busy = client.read_task_runs(task_run_filter=TaskRunFilter(
            tags=TaskRunFilterTags(all_=[pool_tag(self.placement.pool)]),
            state=TaskRunFilterState(type=TaskRunFilterStateType(
                any_=[StateType.PENDING, StateType.RUNNING]))))
        return workers > len(busy)

    def _withdraw_superseded(self, client: Any, sent: _Sent) -> None:
        for call, future in sent.superseded:
            self.withdraw(client, call, future)

    def withdraw(self, client: Any, call: Any, future: Any) -> None:
        """Withdraw an attempt: its marker (a worker runs and writes nothing more), its
        output and heartbeat removed, its task run deleted when queued, else Cancelled."""
        from prefect.states import Cancelled

        mark_withdrawn(call)
        try:
            state = client.read_task_run(future.task_run_id).state
            if state is None or state.is_scheduled():
                client.delete_task_run(future.task_run_id)
            elif not state.is_final():
                client.set_task_run_state(future.task_run_id, Cancelled(
                    message="withdrawn by its run"), force=True)
        except Exception:  # the bookkeeping is best effort: the marker is what counts
            pass

    def _give_up(self, client: Any, sent: _Sent, queued: bool) -> None:
        pool, limit, name = self.placement.pool, self.placement.timeout_s, sent.call.name
        self.withdraw(client, sent.call, sent.future)
        self._withdraw_superseded(client, sent)
        if queued and sent.requeued:
            raise NoEngineWorker(
                f"{name}: an engine worker of pool {pool!r} was subscribed and idle, but "
                f"none received the call within {limit:g} s, sent twice: Prefect's "
                "in-memory task queue lost it (a server restart, or an API served by "
                "several processes: engine workers need one API process)")
        if queued:
            raise NoEngineWorker(
                f"{name}: no engine worker of pool {pool!r} took the call within "
                f"{limit:g} s; start one with `gfcr engine-worker --pool {pool}` "
                "(same Prefect API, result storage and pool key), or raise the timeout")
        raise TimeoutError(f"{name}: the engine worker of pool {pool!r} did not "
                           f"finish within {limit:g} s (its attempts together)")


def _waited(future: Any, left: float) -> bool:
    """Wait up to a second for ``future``; False when Prefect's API did not show its
    state at that moment (a state written by events reaches the API a little later)."""
    try:
        future.wait(timeout=min(1.0, max(0.1, left)))
    except RuntimeError:  # "has no state which means it hasn't started yet"
        return False
    return True


def mark_withdrawn(call: Any) -> None:
    """Mark ``call`` withdrawn and remove its output and heartbeat (gfcr.transport.remote.guard)."""
    out = Path(call.out)
    if out.parent.is_dir():
        Path(call.out + WITHDRAWN).touch()
    for path in (out, Path(call.out + BEAT)):
        path.unlink(missing_ok=True)


def _outside_runs(submit: Callable[[], Any]) -> Any:
    """``submit()`` with no Prefect flow or task run current: ``.delay()`` ships the
    current run context to the worker, and a flow run's context holds the flow object,
    which does not pickle when the flow closes over the live run (gfcr.transport.executors). The
    worker's task run is then not nested under the flow run; its name says the step."""
    from prefect.context import FlowRunContext, TaskRunContext

    def bare() -> Any:
        FlowRunContext.__var__.set(None)  # type: ignore[arg-type]
        TaskRunContext.__var__.set(None)  # type: ignore[arg-type]
        return submit()
    return contextvars.copy_context().run(bare)
