"""The run side of a score pool: a run's scoring filter stages sent to a pool's workers.

A filter stage scores when it writes the ``reward`` column (its column contract,
``writes``), whatever its class: Verify and any other scorer. :class:`RemoteScore` is the
run's scorer (gfcr.core.services.Scorer): for such a stage it writes the step's complete
rollouts as Parquet in the run's staging folder, submits one :class:`ScoreCall` to the
pool's score task (``gfcr_score__<pool>``, served by ``gfcr engine-worker``) and waits for
it, bounded, re-sending a call whose worker was lost
(:class:`gfcr.transport.remote.pool.PoolCalls`). The worker rebuilds the stage and the task
from their configs, so a code verifier still runs the model's code in its sandbox, on
the worker. Other filters (group filters on rewards, length shaping) stay in-process.
"""

from __future__ import annotations

import secrets
import time
import warnings
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa

from gfcr.core.rollout import col
from gfcr.core.filters import applied
from gfcr.transport.remote.call import ScoreCall, code_hash, history_at, spec_hash, write_parquet
from gfcr.transport.remote.pool import PoolCalls, WorkerPool
from gfcr.transport.remote.worker import score_task


def scores(stage: Any) -> bool:
    """Whether ``stage`` is a scoring filter: it writes the reward column."""
    return stage.kind == "filter" and col.REWARD in stage.writes


def for_run(pool: WorkerPool | str | None, pipeline: Any, run_id: str, root: Path,
            notify: Callable[[str], None]) -> "RemoteScore | None":
    """The scorer of ``run_id`` on ``pool`` (a name: the default timeouts); None
    without a pool."""
    if pool is None:
        return None
    placement = WorkerPool(pool=pool) if isinstance(pool, str) else pool
    return RemoteScore(placement, pipeline=pipeline, run_id=run_id, root=root,
                       notify=notify)


class RemoteScore:
    """Sends one run's scoring filter calls to ``placement.pool`` (see the module)."""

    def __init__(self, placement: WorkerPool, *, pipeline: Any, run_id: str, root: Path,
                 notify: Callable[[str], None]) -> None:
        from prefect.settings import PREFECT_API_URL

        if not PREFECT_API_URL.value():
            raise RuntimeError(f"score pool {placement.pool!r} needs a Prefect API server "
                               "that engine workers reach too: set PREFECT_API_URL")
        self.pipeline, self.run_id = pipeline, run_id
        self.staging = Path(root).resolve() / "staging" / run_id / "remote"
        self.calls = PoolCalls(placement, score_task, notify)
        self.reports: list[dict[str, Any]] = []

    def score(self, ctx: Any, stage: Any, rows: pa.Table) -> pa.Table:
        """``stage``'s result on ``rows`` (its drops marked), from a worker of the pool;
        run here when ``stage`` does not score or there is nothing to score."""
        if not scores(stage) or rows.num_rows == 0:
            return applied(stage.apply(ctx, rows), stage.label)
        started = time.perf_counter()
        call = self._call(ctx, stage)
        write_parquet(call.rows, rows)
        sent = self.calls.send(call, rows, started)
        report, table = self.calls.collect(sent)
        for message in report.get("warnings", []):
            warnings.warn(message, stacklevel=2)
        report.update(name=call.name, step=ctx.step, wall_s=time.perf_counter() - started)
        self.reports.append(report)
        return table

    def _call(self, ctx: Any, stage: Any) -> ScoreCall:
        dumped = stage.model_dump(mode="json")
        task = self.pipeline.task.model_dump(mode="json")
        stem = f"{ctx.step}-{ctx.round}-{stage.label}-{secrets.token_hex(3)}"
        return ScoreCall(run_id=self.run_id, step=ctx.step, round=ctx.round,
                         quota=ctx.quota, seed=self.pipeline.seed,
                         policy_version=ctx.policy_version, stage=dumped, task=task,
                         rows=str(self.staging / f"{stem}-rows.parquet"),
                         out=str(self.staging / f"{stem}-scored.parquet"),
                         code_hash=code_hash(), spec_hash=spec_hash(dumped, task),
                         **history_at(ctx))
