"""Engine workers: long-lived processes that run generate stage calls for any run.

``gfcr engine-worker --pool NAME`` serves the pool's Prefect task with
``prefect.task_worker.serve`` (:func:`gfcr.transport.remote.serve.serve_pool`). Each call (:class:`GenerateCall`)
names its run, configs and policy version; the worker builds the policy, engine and task
from the configs once per (run, policy/engine/task config) and keeps them loaded between
tasks (:class:`Engines`), loads the weight version the call names in place when it is not
the one loaded, runs the generate stage (with the in-flight hooks the call names, and the
step's History: the run's store opened read-only at the call's snapshot) and writes the
rollouts as a Parquet file where the call says.

The pool's task is the function :func:`_generate` under the name
``gfcr_generate__<pool>``: Prefect routes a task run to the workers whose task key (the
function's name and a hash of its code) matches, so each pool is its own queue, and a
worker whose gfcr differs in other places still takes the call and refuses it, naming
both code hashes, instead of leaving it queued forever. The same process serves the
pool's score calls (:class:`ScoreCall`, :func:`run_score`) as a second task,
``gfcr_score__<pool>``: a CPU-only pool is ``gfcr engine-worker --pool cpu`` on a host
whose runs name it with ``--score-pool cpu``.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import types
from pathlib import Path
from collections import OrderedDict
from contextlib import contextmanager
from typing import Any, Iterator

from gfcr.transport.remote.call import (GenerateCall, Refused, ScoreCall, check_pool, code_hash,
                                        read_parquet, spec_hash, write_parquet)
from gfcr.transport.remote.guard import admit, withdrawn

log = logging.getLogger("gfcr.engine_worker")

BEAT, BEAT_S = ".beat", 1.0
"""A running call's heartbeat: a file beside its output, touched every BEAT_S seconds, by
which the run tells a lost worker (killed, its host gone) from a slow one."""

CACHED_ENGINES = 2
"""Engines a worker keeps loaded (one per run and policy config), oldest dropped first."""


class _Loaded:
    """One run's policy, engine and task on this worker, and the version loaded."""

    def __init__(self, call: GenerateCall) -> None:
        from gfcr.core.stage import lookup

        policy_spec: Any = lookup("policy", call.policy["type"]).model_validate(call.policy)
        engine_spec: Any = lookup("engine", call.engine["type"]).model_validate(call.engine)
        self.policy = policy_spec.build(seed=call.seed)
        self.engine = engine_spec.build(self.policy, seed=call.seed)
        self.task: Any = lookup("task", call.task["type"]).model_validate(call.task)
        self.version: tuple[int, str] | None = None
        """(version, publication id) loaded from the published weights; None: none yet."""

    def at_version(self, call: GenerateCall) -> bool:
        """Load the call's weights version in place unless loaded; whether it loaded. A
        version is known by its publication, not its number: a resumed run publishes
        its numbers again (gfcr.runner.weights)."""
        from gfcr.runner.weights import WeightStore

        weights = WeightStore(Path(call.weights), self.policy.io)
        published = weights.get(call.policy_version)
        if self.version == (call.policy_version, published.ident):
            return False
        self.policy.load_weights(published.weights)
        self.engine.update_weights()  # an engine with its own copy refreshes it
        self.policy.version = call.policy_version
        self.version = (call.policy_version, published.ident)
        return True


class Engines:
    """The engines this worker holds, by (run, configs); one call at a time per worker."""

    def __init__(self, size: int = CACHED_ENGINES) -> None:
        self.size, self.lock = size, threading.Lock()
        self.held: OrderedDict[tuple[str, str, str], _Loaded] = OrderedDict()
        self.builds = 0

    def get(self, call: GenerateCall) -> _Loaded:
        key = (call.run_id, call.weights,
               spec_hash({}, (), call.policy, call.engine, call.task))
        if key not in self.held:
            while len(self.held) >= self.size:
                self.held.popitem(last=False)
            self.held[key] = _Loaded(call)
            self.builds += 1
        self.held.move_to_end(key)
        return self.held[key]


ENGINES = Engines()
WORKER = f"{socket.gethostname()}:{os.getpid()}"
"""This process's name as an engine worker (``--name`` replaces it)."""


def check(call: GenerateCall) -> tuple[Any, list[Any]]:
    """The call's stage and hooks as this worker's classes validate them; Refused when
    this worker's code or its reading of the configs differs from the run's."""
    from gfcr.core.stage import lookup

    _same_code(call.run_id, call.code_hash)
    stage = lookup("generate", call.stage["type"]).model_validate(call.stage)
    hooks = [lookup("control", h["type"]).model_validate(h) for h in call.hooks]
    mine = spec_hash(stage.model_dump(mode="json"),
                     tuple(h.model_dump(mode="json") for h in hooks),
                     _dump("policy", call.policy), _dump("engine", call.engine),
                     _dump("task", call.task))
    if mine != call.spec_hash:
        raise Refused(f"engine worker {WORKER} reads run {call.run_id!r}'s configs "
                      f"differently: worker spec {mine}, run spec {call.spec_hash}")
    return stage, hooks


def _same_code(run_id: str, theirs: str) -> None:
    if theirs != code_hash():
        raise Refused(f"engine worker {WORKER} runs other code than run {run_id!r}: "
                      f"worker code {code_hash()}, run code {theirs}; start the "
                      "worker from the same gfcr, stages and store")


def _dump(kind: Any, data: dict[str, Any]) -> dict[str, Any]:
    from gfcr.core.stage import lookup

    return lookup(kind, data["type"]).model_validate(data).model_dump(mode="json")


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


def run_call(call: GenerateCall) -> dict[str, Any]:
    """Run one call on this worker; what it reports (output path, rows, worker, times)."""
    from gfcr.core.stage import StepContext
    from gfcr.runner.inprocess import SegmentHooks

    started = time.perf_counter()
    stage, hooks = check(call)
    with ENGINES.lock, _beating(call.out + BEAT):  # until the output is in place
        loaded = ENGINES.get(call)
        loading = time.perf_counter()
        fresh = loaded.at_version(call)
        load_s = time.perf_counter() - loading
        ctx = StepContext(run_id=call.run_id, step=call.step, seed=call.seed,
                          policy_version=call.policy_version, task=loaded.task,
                          history=_history(call), round=call.round, quota=call.quota)
        plan = read_parquet(call.plan)
        generating = time.perf_counter()
        table = stage.generate(ctx, plan, loaded.engine,
                               SegmentHooks(ctx, hooks) if hooks else None)
        generated = time.perf_counter() - generating
        _write_out(call, table)
    return {"out": call.out, "rows": table.num_rows, "worker": WORKER,
            "loaded_version": fresh, "engines_built": ENGINES.builds, "load_s": load_s,
            "generate_s": generated,
            "worker_s": time.perf_counter() - started}


def _write_out(call: GenerateCall | ScoreCall, table: Any) -> None:
    """Write the call's output, beating (issue 21 D3), unless its run withdrew the call
    meanwhile; never making the run's folder again (gfcr.transport.remote.guard)."""
    if not withdrawn(call):
        write_parquet(call.out, table, make_folder=False)


def _history(call: GenerateCall | ScoreCall) -> Any:
    """The step's History as the run pinned it: the run's store opened read-only (once
    per worker, gfcr.core.storage.other_store) at the call's snapshot; None without a store."""
    from gfcr.core.storage import other_store

    if call.store is None:
        return None
    return other_store(call.store, as_of_snapshot=call.snapshot, run_id=call.run_id)


def _generate(name: str, call: dict[str, Any], mac: str = "") -> dict[str, Any]:
    """The pool task's body: one generate stage call (``name`` names the task run),
    run only when signed with the pool's key and its files are its run's (guard)."""
    parsed = GenerateCall.model_validate(call)
    admit("generate", parsed, mac, WORKER, _task_run_id())
    _sign(name)
    if withdrawn(parsed):
        return {"out": parsed.out, "withdrawn": True, "worker": WORKER}
    report = run_call(parsed)
    log.info("%s ran on engine worker %s (version %d, %d rows, %.2f s)", name, WORKER,
             parsed.policy_version, report["rows"], report["worker_s"])
    return report


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
    marked (gfcr.runner.filters.applied), written where the call says; what it reports (with the
    warnings the stage gave, which the run gives again on its side)."""
    import warnings

    from gfcr.core.stage import StepContext
    from gfcr.runner.filters import applied

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
    kept (a verifier's sandbox or compiled pattern is built once); Refused when this
    worker reads the configs differently from the run."""
    from gfcr.core.stage import lookup

    if call.spec_hash not in _SCORERS:
        stage = lookup("filter", call.stage["type"]).model_validate(call.stage)
        task = lookup("task", call.task["type"]).model_validate(call.task)
        mine = spec_hash(stage.model_dump(mode="json"), (), {}, {},
                         task.model_dump(mode="json"))
        if mine != call.spec_hash:
            raise Refused(f"engine worker {WORKER} reads run {call.run_id!r}'s configs "
                          f"differently: worker spec {mine}, run spec {call.spec_hash}")
        while len(_SCORERS) >= 8:
            _SCORERS.popitem(last=False)
        _SCORERS[call.spec_hash] = (stage, task)
    return _SCORERS[call.spec_hash]


def _score(name: str, call: dict[str, Any], mac: str = "") -> dict[str, Any]:
    """The score task's body: one scoring filter stage call (checked as _generate's)."""
    parsed = ScoreCall.model_validate(call)
    admit("score", parsed, mac, WORKER, _task_run_id())
    _sign(name)
    if withdrawn(parsed):
        return {"out": parsed.out, "withdrawn": True, "worker": WORKER}
    report = run_score(parsed)
    log.info("%s ran on engine worker %s (%d rows, %.2f s)", name, WORKER, report["rows"],
             report["worker_s"])
    return report


_TASKS: dict[tuple[str, str], Any] = {}


def pool_tag(pool: str) -> str:
    """The tag of a pool's task runs, by which a run counts the pool's busy workers."""
    return f"gfcr-pool:{pool}"


def pool_task(pool: str) -> Any:
    """The Prefect task for ``pool``'s generate calls (built once per process): the one
    the run submits with ``.delay()`` and the worker serves, under the key
    ``gfcr_generate__<pool>``."""
    return _task(_generate, "generate", pool)


def score_task(pool: str) -> Any:
    """The Prefect task for ``pool``'s score calls, key ``gfcr_score__<pool>``."""
    return _task(_score, "score", pool)


def _task(body: Any, what: str, pool: str) -> Any:
    from prefect import task
    from prefect.cache_policies import NO_CACHE

    check_pool(pool)
    if (what, pool) not in _TASKS:
        fn = types.FunctionType(body.__code__, body.__globals__, f"gfcr_{what}__{pool}",
                                body.__defaults__)
        fn.__qualname__ = fn.__name__
        fn.__doc__ = body.__doc__
        fn.__annotations__ = dict(body.__annotations__)
        _TASKS[what, pool] = task(name=f"{what}@{pool}", task_run_name="{name}",
                                  cache_policy=NO_CACHE, persist_result=True, retries=0,
                                  tags={pool_tag(pool)})(fn)
    return _TASKS[what, pool]
