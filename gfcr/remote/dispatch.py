"""The run side of engine workers: a run's generate stage sent to a pool.

:class:`RemoteGenerate` is the run's generator (gfcr.services.Generator): for each
generate call it publishes the learner's newest weights handle when that version is
not yet published (:mod:`gfcr.weights`), writes the plan as Parquet in the run's staging
folder, submits one task run with ``.delay()`` (one per step's batch, never one per
rollout) and waits for it, bounded: a run whose task no worker takes says so after
``warn_s`` and fails after ``timeout_s`` naming the pool (Prefect's own ``.result()``
would wait forever), deleting the queued task run so no worker runs it later. That
sending and waiting is :class:`PoolCalls`, which the score calls share (gfcr.remote.scoring).
"""

from __future__ import annotations

import contextvars
import logging
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field, field_validator

from gfcr.capabilities import WeightsDtype
from gfcr.remote.call import (GenerateCall, check_pool, code_hash, history_at, read_parquet,
                              spec_hash)
from gfcr.remote.worker import BEAT, pool_task
from gfcr.rounds import staleness
from gfcr.services import WeightHandle
from gfcr.weights import FileSync, WeightStore, directory

log = logging.getLogger("gfcr.remote")


class NoEngineWorker(TimeoutError):
    """No engine worker took a call of the pool within the timeout."""

    gfcr_retry = False  # a retry would wait the whole timeout again (gfcr.executors)


class GeneratePool(BaseModel):
    """Where a run's generate stage runs: on the engine workers of ``pool``.

    A run option, not a pipeline field: it says where the work runs, not what it is, so
    the same pipeline (and spec hash) gives the same rollouts in-process or on workers."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    pool: str
    timeout_s: float = Field(600.0, gt=0)
    """Fail a call that no worker finished within this many seconds."""
    warn_s: float = Field(10.0, ge=0)
    """Say that the run waits for a worker once a call is queued this long."""
    lost_s: float = Field(30.0, gt=0)
    """A running call whose worker's heartbeat is this old is sent again (a worker killed
    mid-task); the step uses whichever attempt finishes, and only the run commits."""
    keep: int = Field(3, ge=2)
    """Published weight versions kept (gfcr.weights)."""

    @field_validator("pool")
    @classmethod
    def _pool(cls, value: str) -> str:
        return check_pool(value)


def for_run(pool: GeneratePool | str | None, pipeline: Any, run_id: str, root: Path,
            local: Any, notify: Callable[[str], None]) -> "RemoteGenerate | None":
    """The generator of ``run_id`` on ``pool`` (a name: the default timeouts), with the
    run's own generator ``local`` for evaluation; None without a pool."""
    if pool is None:
        return None
    placement = GeneratePool(pool=pool) if isinstance(pool, str) else pool
    return RemoteGenerate(placement, pipeline=pipeline, run_id=run_id, root=root,
                          local=local, notify=notify)


@dataclass
class _Sent:
    """A call sent to a pool: its task run, and the table it was sent with."""

    call: Any
    """A GenerateCall or a ScoreCall (gfcr.remote.call)."""
    future: Any
    plan: pa.Table
    """The call's input table (a generate call's plan, a score call's rows)."""
    sent: float
    delay_s: float
    """Seconds ``.delay()`` took (creating the task run, storing its parameters)."""


class RemoteGenerate:
    """Sends one run's generate calls to ``placement.pool`` (see the module docstring);
    each call returns at once, so the loop can keep batches of later steps in flight
    (gfcr.rounds). Evaluation and the in-process engine's sleep stay with ``local``."""

    def __init__(self, placement: GeneratePool, *, pipeline: Any, run_id: str, root: Path,
                 local: Any, notify: Callable[[str], None] | None = None) -> None:
        from prefect.settings import PREFECT_API_URL

        if not PREFECT_API_URL.value():
            raise RuntimeError(f"generate pool {placement.pool!r} needs a Prefect API server "
                               "that engine workers reach too: set PREFECT_API_URL")
        self.placement, self.run_id, self.pipeline = placement, run_id, pipeline
        self.local = local  # the run's own engine: evaluates, and sleeps while training
        self.handle: WeightHandle | None = None  # None: the weights the run started with
        keep = max(placement.keep, self.pipeline.max_staleness + 2)
        self.weights = WeightStore(directory(root, run_id), local.policy.io, keep=keep)
        spec = pipeline.engine
        self.sync = FileSync(self.weights, run_id,
                             spec.weights_dtype if isinstance(spec, WeightsDtype) else None)
        self.staging = Path(root).resolve() / "staging" / run_id / "remote"
        self.publish_s = 0.0  # publishing weights since the last step's metrics
        self.notify = notify or log.warning
        self.calls = PoolCalls(placement, pool_task, self.notify)
        self.reports: list[dict[str, Any]] = []
        """What each finished call's worker reported, with the call's name and wall time."""

    @property
    def version(self) -> int:
        return self.local.version if self.handle is None else self.handle.version

    @property
    def capabilities(self) -> frozenset[str]:
        return frozenset(self.local.capabilities)

    def submit(self, ctx: Any, gen: Any, plan: pa.Table, hooks: list[Any]) -> "_Waiting":
        """Send ``gen`` on ``plan`` to the pool with the weights loaded last; the call's
        rollouts once a worker has generated them."""
        from gfcr.remote.call import write_parquet

        started = time.perf_counter()
        call = self._call(ctx, gen, hooks)
        write_parquet(call.plan, plan)
        return _Waiting(self, ctx.step, self.calls.send(call, plan, started))

    def load(self, handle: WeightHandle) -> None:
        """Calls sent from now on generate with ``handle``'s weights, published on the
        next send (here, on the loop's thread, before the learner updates again)."""
        self.handle = handle

    def evaluate(self, task: Any, prompts: pa.Table, *, handle: WeightHandle,
                 max_tokens: int, progress: Callable[[int, int], None] | None
                 ) -> dict[str, Any]:
        return dict(self.local.evaluate(task, prompts, handle=handle, max_tokens=max_tokens,
                                        progress=progress))

    def asleep(self) -> Any:
        return self.local.asleep()

    def get_rng_state(self) -> object:
        return self.local.get_rng_state()

    def set_rng_state(self, state: object) -> None:
        self.local.set_rng_state(state)

    def close(self) -> None:
        self.local.close()

    def step_metrics(self, ctx: Any, rollouts: pa.Table) -> dict[str, float]:
        """The step's staleness (versions behind the step's) and its calls' times."""
        mine = [r for r in self.reports if r["step"] == ctx.step]
        metrics = staleness(rollouts, ctx.policy_version)
        for key in ("worker_s", "wall_s", "delay_s", "load_s"):
            metrics[f"remote/{key}"] = sum(r[key] for r in mine)
        metrics["remote/publish_s"], self.publish_s = self.publish_s, 0.0
        return metrics

    def _call(self, ctx: Any, gen: Any, hooks: list[Any]) -> GenerateCall:
        if self.handle is None:
            raise RuntimeError("the generator was sent a call before any weights")
        version, publishing = self.handle.version, time.perf_counter()
        self.sync.send(self.handle)  # once per version
        self.publish_s += time.perf_counter() - publishing
        dumps = dict(stage=gen.model_dump(mode="json"),
                     hooks=tuple(h.model_dump(mode="json") for h in hooks),
                     policy=self.pipeline.policy.model_dump(mode="json"),
                     engine=self.pipeline.engine.model_dump(mode="json"),
                     task=self.pipeline.task.model_dump(mode="json"))
        stem = f"{ctx.step}-{ctx.round}-{gen.label}-v{version}-{secrets.token_hex(3)}"
        return GenerateCall(run_id=self.run_id, step=ctx.step, round=ctx.round,
                            quota=ctx.quota, seed=self.pipeline.seed, policy_version=version,
                            weights=str(self.weights.where.resolve()),
                            plan=str(self.staging / f"{stem}-plan.parquet"),
                            out=str(self.staging / f"{stem}-rollouts.parquet"),
                            code_hash=code_hash(), spec_hash=spec_hash(**dumps),
                            **history_at(ctx), **dumps)


@dataclass
class _Waiting:
    """A generate call sent to the pool (gfcr.services.Pending): its rollouts, waited
    for once."""

    owner: RemoteGenerate
    step: int
    sent: _Sent

    def result(self) -> pa.Table:
        sent = self.sent
        report = self.owner.calls.wait(sent)
        report.update(name=sent.call.name, step=self.step, delay_s=sent.delay_s,
                      wall_s=time.perf_counter() - sent.sent, version=sent.call.policy_version)
        self.owner.reports.append(report)
        return read_parquet(report["out"])


class PoolCalls:
    """Sends calls of one kind to a pool's Prefect task and waits for each, bounded (see
    the module docstring): shared by the generate and the score calls. ``task(pool)`` is
    the pool's task (gfcr.remote.worker); a call is a model with ``name`` and ``out``."""

    def __init__(self, placement: GeneratePool, task: Callable[[str], Any],
                 notify: Callable[[str], None]) -> None:
        self.placement, self.task, self.notify = placement, task, notify

    def send(self, call: Any, inputs: pa.Table, started: float) -> _Sent:
        """Submit ``call`` (whose input tables are already staged) with ``.delay()``."""
        delaying = time.perf_counter()
        future = _outside_runs(lambda: self.task(self.placement.pool).delay(
            name=call.name, call=call.model_dump(mode="json")))
        return _Sent(call, future, inputs, started, time.perf_counter() - delaying)

    def wait(self, sent: _Sent) -> dict[str, Any]:
        """The call's result, waiting at most ``timeout_s`` (from its last sending):
        NoEngineWorker naming the pool when no worker took it, TimeoutError when one took
        it and ran too long; sent again when its worker's heartbeat stops (``lost_s``)."""
        from prefect import get_client

        pool, limit, name = self.placement.pool, self.placement.timeout_s, sent.call.name
        started, warned = time.monotonic(), False
        with get_client(sync_client=True) as client:
            while True:
                state = client.read_task_run(sent.future.task_run_id).state
                if state is not None and state.is_final():
                    return dict(sent.future.result())
                waited = time.monotonic() - started
                queued = state is None or state.is_scheduled() or state.is_pending()
                if not queued and self._lost(sent.call, waited):
                    self.notify(f"{name}: the engine worker of pool {pool!r} running it "
                                f"stopped signalling for {self.placement.lost_s:g} s; "
                                "sending the call again")
                    sent, started = self._again(sent), time.monotonic()
                    continue
                if waited >= limit:
                    self._give_up(client, sent, name, queued)
                if queued and not warned and waited >= self.placement.warn_s:
                    warned = True
                    self.notify(f"{name}: waiting for an engine worker of pool {pool!r} "
                                f"(none has taken the call for {waited:.0f} s; failing "
                                f"after {limit:g} s)")
                if state is None:  # between Prefect's events and its API: ask again
                    time.sleep(0.2)
                    continue
                try:
                    sent.future.wait(timeout=min(1.0, max(0.1, limit - waited)))
                except RuntimeError:  # the future's own read saw no state yet (a loaded
                    time.sleep(0.2)   # server answers its reads out of step): ask again

    def _lost(self, call: Any, waited: float) -> bool:
        """Whether the worker running ``call`` stopped its heartbeat (none yet: counted
        from when the run started waiting)."""
        beat = Path(call.out + BEAT)
        age = time.time() - beat.stat().st_mtime if beat.exists() else waited
        return age > self.placement.lost_s

    def _again(self, sent: _Sent) -> _Sent:
        """``sent``'s call sent once more, writing to a new output file."""
        out = f"{sent.call.out.removesuffix('.parquet')}-again{secrets.token_hex(2)}.parquet"
        return self.send(sent.call.model_copy(update={"out": out}), sent.plan, sent.sent)

    def _give_up(self, client: Any, sent: _Sent, name: str, queued: bool) -> None:
        pool, limit = self.placement.pool, self.placement.timeout_s
        if queued:
            client.delete_task_run(sent.future.task_run_id)
            raise NoEngineWorker(
                f"{name}: no engine worker of pool {pool!r} took the call within "
                f"{limit:g} s; start one with `gfcr engine-worker --pool {pool}` "
                "(same Prefect API and result storage), or raise the timeout")
        raise TimeoutError(f"{name}: the engine worker of pool {pool!r} did not "
                           f"finish within {limit:g} s")



def _outside_runs(submit: Callable[[], Any]) -> Any:
    """``submit()`` with no Prefect flow or task run current: ``.delay()`` ships the
    current run context to the worker, and a flow run's context holds the flow object,
    which does not pickle when the flow closes over the live run (gfcr.executors). The
    worker's task run is then not nested under the flow run; its name says the step."""
    from prefect.context import FlowRunContext, TaskRunContext

    def bare() -> Any:
        FlowRunContext.__var__.set(None)  # type: ignore[arg-type]
        TaskRunContext.__var__.set(None)  # type: ignore[arg-type]
        return submit()
    return contextvars.copy_context().run(bare)
