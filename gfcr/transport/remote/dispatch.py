"""The run side of engine workers: a run's generate stage sent to a pool.

:class:`RemoteGenerate` is the run's generator (gfcr.core.services.Generator): for each
generate call it publishes the learner's newest weights handle when that version is
not yet published (:mod:`gfcr.runner.weights`), writes the plan as Parquet in the run's staging
folder, submits one task run with ``.delay()`` (one per step's batch, never one per
rollout) and waits for it, bounded (:class:`gfcr.transport.remote.pool.PoolCalls`, which the
score calls share: one deadline per call, a capped number of re-sendings, a call lost in
Prefect's queue sent again, superseded attempts withdrawn). A finished call's files are
removed as soon as its output is read. The loop draws each plan once (gfcr.runner.rounds), so
no batch sent ahead is ever drawn again and dropped.
"""

from __future__ import annotations

import logging
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa

from gfcr.core.capabilities import WeightsDtype
from gfcr.core.services import WeightHandle
from gfcr.runner.rounds import staleness
from gfcr.runner.weights import FileSync, WeightStore, directory
from gfcr.transport.remote.call import GenerateCall, code_hash, history_at, spec_hash
from gfcr.transport.remote.pool import GeneratePool, LostCall, NoEngineWorker, PoolCalls, _Sent
from gfcr.transport.remote.worker import pool_task

__all__ = ["GeneratePool", "LostCall", "NoEngineWorker", "PoolCalls", "RemoteGenerate",
           "for_run"]

log = logging.getLogger("gfcr.transport.remote")


def for_run(pool: GeneratePool | str | None, pipeline: Any, run_id: str, root: Path,
            local: Any, notify: Callable[[str], None]) -> "RemoteGenerate | None":
    """The generator of ``run_id`` on ``pool`` (a name: the default timeouts), with the
    run's own generator ``local`` for evaluation; None without a pool."""
    if pool is None:
        return None
    placement = GeneratePool(pool=pool) if isinstance(pool, str) else pool
    return RemoteGenerate(placement, pipeline=pipeline, run_id=run_id, root=root,
                          local=local, notify=notify)


class RemoteGenerate:
    """Sends one run's generate calls to ``placement.pool`` (see the module docstring);
    each call returns at once, so the loop can keep batches of later steps in flight
    (gfcr.runner.rounds). Evaluation and the in-process engine's sleep stay with ``local``."""

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
        from gfcr.transport.remote.call import write_parquet

        started = time.perf_counter()
        call = self._call(ctx, gen, hooks)
        write_parquet(call.plan, plan)
        # with steps in flight a call may wait for its step: it carries no expiry then
        ahead = self.pipeline.max_staleness > 0
        return _Waiting(self, ctx.step, self.calls.send(call, plan, started, ahead=ahead))

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
        """The step's staleness (versions behind the step's), its calls' times, and how
        many calls generated its first round (one: a plan is drawn and sent once)."""
        mine = [r for r in self.reports if r["step"] == ctx.step]
        metrics = staleness(rollouts, ctx.policy_version)
        for key in ("worker_s", "wall_s", "delay_s", "load_s"):
            metrics[f"remote/{key}"] = sum(r[key] for r in mine)
        metrics["remote/first_round_calls"] = float(sum(r["round"] == 0 for r in mine))
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
    """A generate call sent to the pool (gfcr.core.services.Pending): its rollouts, waited
    for once."""

    owner: RemoteGenerate
    step: int
    sent: _Sent

    def result(self) -> pa.Table:
        sent = self.sent
        report, table = self.owner.calls.collect(sent)
        report.update(name=sent.call.name, step=self.step, round=sent.call.round,
                      delay_s=sent.delay_s, wall_s=time.perf_counter() - sent.sent,
                      version=sent.call.policy_version)
        self.owner.reports.append(report)
        return table
