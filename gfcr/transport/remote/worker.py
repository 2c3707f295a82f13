"""A pool's workers: long-lived processes that run scoring filter stage calls for any run.

``gfcr engine-worker --pool NAME`` serves the pool's Prefect task with
``prefect.task_worker.serve`` (:func:`gfcr.transport.remote.serve.serve_pool`). Each call
(:class:`ScoreCall`) names its run, the stage's and the task's configs and the rows to
score; the worker rebuilds the stage and the task once per configs (:func:`_scorer`),
runs the stage on the rows (with the step's History: the run's store opened read-only at
the call's snapshot) and writes the scored rows as a Parquet file where the call says.
A run names the pool with ``gfcr run --score-pool NAME``.

The pool's task is the function :func:`_score` under the name ``gfcr_score__<pool>``:
Prefect routes a task run to the workers whose task key (the function's name and a hash
of its code) matches, so each pool is its own queue, and a worker whose gfcr differs in
other places still takes the call and refuses it, naming both code hashes, instead of
leaving it queued forever. (Until issue 24 the same workers also ran a run's generate
stage; generation now leaves a run's process only on a fleet, gfcr.transport.fleet.)
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import types
from collections import OrderedDict
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from gfcr.transport.remote.call import (CallRefused, ScoreCall, check_pool, code_hash,
                                        read_parquet, spec_hash, write_parquet)
from gfcr.transport.remote.guard import admit, withdrawn

log = logging.getLogger("gfcr.engine_worker")

BEAT, BEAT_S = ".beat", 1.0
"""A running call's heartbeat: a file beside its output, touched every BEAT_S seconds, by
which the run tells a lost worker (killed, its host gone) from a slow one."""

WORKER = f"{socket.gethostname()}:{os.getpid()}"
"""This process's name as an engine worker (``--name`` replaces it)."""


def _same_code(run_id: str, theirs: str) -> None:
    if theirs != code_hash():
        raise CallRefused(f"engine worker {WORKER} runs other code than run {run_id!r}: "
                          f"worker code {code_hash()}, run code {theirs}; start the "
                          "worker from the same gfcr, stages and store")


@contextmanager
def _beating(path: str) -> Iterator[None]:
    """Touch ``path`` (holding this worker's name) every BEAT_S seconds while the block
    runs."""
    stop = threading.Event()

    def beat() -> None:
        while True:
            try:
                Path(path).touch(exist_ok=True)
            except OSError:  # the run ended and removed its folder: nothing to signal
                return
            if stop.wait(BEAT_S):
                return
    Path(path).write_text(WORKER)  # which worker runs the call (in its run's folder)
    thread = threading.Thread(target=beat, name="gfcr-beat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def _write_out(call: ScoreCall, table: Any) -> None:
    """Write the call's output, beating (issue 21 D3), unless its run withdrew the call
    meanwhile; never making the run's folder again (gfcr.transport.remote.guard)."""
    if not withdrawn(call):
        write_parquet(call.out, table, make_folder=False)


def _history(call: ScoreCall) -> Any:
    """The step's History as the run pinned it: the run's store opened read-only (once
    per worker, gfcr.core.storage.other_store) at the call's snapshot; None without a store."""
    from gfcr.core.storage import other_store

    if call.store is None:
        return None
    return other_store(call.store, as_of_snapshot=call.snapshot, run_id=call.run_id)


def _task_run_id() -> str:
    """The id of the task run this call came in (empty outside one)."""
    from prefect.context import TaskRunContext

    ctx = TaskRunContext.get()
    return "" if ctx is None else str(ctx.task_run.id)


def _sign(name: str) -> None:
    """Rename the current task run ``NAME @ WORKER``: the UI and API show which worker
    ran each call. (A task run of a task worker has no flow run, so its logs do not reach
    the API.)"""
    from prefect import get_client
    from prefect.context import TaskRunContext

    ctx = TaskRunContext.get()
    if ctx is None:
        return
    signed = f"{name} @ {WORKER}"
    ctx.task_run.name = signed  # the engine's state events carry the run's name
    with get_client(sync_client=True) as client:
        client.set_task_run_name(ctx.task_run.id, signed).raise_for_status()


def run_score(call: ScoreCall) -> dict[str, Any]:
    """Run one scoring filter stage call: the stage's result on the call's rows, its drops
    marked (gfcr.core.filters.applied), written where the call says; what it reports (with the
    warnings the stage gave, which the run gives again on its side)."""
    import warnings

    from gfcr.core.stage import StepContext
    from gfcr.core.filters import applied

    started = time.perf_counter()
    _same_code(call.run_id, call.code_hash)
    stage, task = _scorer(call)
    with _beating(call.out + BEAT), warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        ctx = StepContext(run_id=call.run_id, step=call.step, seed=call.seed,
                          policy_version=call.policy_version, task=task,
                          history=_history(call), round=call.round, quota=call.quota)
        table = applied(stage.apply(ctx, read_parquet(call.rows)), stage.label)
        _write_out(call, table)
    return {"out": call.out, "rows": table.num_rows, "worker": WORKER,
            "warnings": [str(w.message) for w in said],
            "worker_s": time.perf_counter() - started}


_SCORERS: OrderedDict[str, tuple[Any, Any]] = OrderedDict()


def _scorer(call: ScoreCall) -> tuple[Any, Any]:
    """The call's stage and task, rebuilt from their configs once per (stage, task) and
    kept (a verifier's sandbox or compiled pattern is built once); CallRefused when this
    worker reads the configs differently from the run."""
    from gfcr.core.registry import lookup

    if call.spec_hash not in _SCORERS:
        stage = lookup("filter", call.stage["type"]).model_validate(call.stage)
        task = lookup("task", call.task["type"]).model_validate(call.task)
        mine = spec_hash(stage.model_dump(mode="json"), task.model_dump(mode="json"))
        if mine != call.spec_hash:
            raise CallRefused(f"engine worker {WORKER} reads run {call.run_id!r}'s configs "
                              f"differently: worker spec {mine}, run spec {call.spec_hash}")
        while len(_SCORERS) >= 8:
            _SCORERS.popitem(last=False)
        _SCORERS[call.spec_hash] = (stage, task)
    return _SCORERS[call.spec_hash]


def _score(name: str, call: dict[str, Any], mac: str = "") -> dict[str, Any]:
    """The pool task's body: one scoring filter stage call (``name`` names the task
    run), run only when signed with the pool's key and its files are its run's (guard)."""
    parsed = ScoreCall.model_validate(call)
    admit("score", parsed, mac, WORKER, _task_run_id())
    _sign(name)
    if withdrawn(parsed):
        return {"out": parsed.out, "withdrawn": True, "worker": WORKER}
    report = run_score(parsed)
    log.info("%s ran on engine worker %s (%d rows, %.2f s)", name, WORKER, report["rows"],
             report["worker_s"])
    return report


_TASKS: dict[str, Any] = {}
"""Pool name -> its score task (built once per process)."""


def pool_tag(pool: str) -> str:
    """The tag of a pool's task runs, by which a run counts the pool's busy workers."""
    return f"gfcr-pool:{pool}"


def score_task(pool: str) -> Any:
    """The Prefect task for ``pool``'s score calls (built once per process): the one the
    run submits with ``.delay()`` and the worker serves, under the key
    ``gfcr_score__<pool>`` (:func:`_score` under a name of the pool's own)."""
    from prefect import task
    from prefect.cache_policies import NO_CACHE

    check_pool(pool)
    if pool not in _TASKS:
        fn = types.FunctionType(_score.__code__, _score.__globals__, f"gfcr_score__{pool}",
                                _score.__defaults__)
        fn.__qualname__ = fn.__name__
        fn.__doc__ = _score.__doc__
        fn.__annotations__ = dict(_score.__annotations__)
        _TASKS[pool] = task(name=f"score@{pool}", task_run_name="{name}",
                            cache_policy=NO_CACHE, persist_result=True, retries=0,
                            tags={pool_tag(pool)})(fn)
    return _TASKS[pool]
