"""Asynchronous steps with bounded staleness: the plans of steps ahead, and staleness.

With ``Pipeline.max_staleness = k > 0`` and a generate pool, the generate call of step t
also sends the batches of steps t+1..t+k to the engine workers, generated with the
weights of step t (the newest published), so they generate while step t filters and
trains here. Their plans are drawn ahead by the same select and allocate stages with
the same step seeds (:func:`plan_ahead`); when step s comes, the loop draws its plan as
always and the batch sent ahead is used only if the plans are equal (a select stage that
reads the run's history may choose otherwise: the batch is then generated again, with
the same weights version, so a run never trains on prompts its stages did not choose).
Rows keep the version they were generated with (``policy_version_start``), which the
learner's decoupled-PPO correction uses for off-policy rows (stages/train/offpolicy.py).

So the round-0 batch of step s is generated with the weights the run had at the start of
step max(s - k, 0). A resumed run keeps that: its first steps' batches were in flight
when it stopped, and are sent again with the version they were sent with
(:func:`version_sent`), read from the store's step metrics (``remote/step_version``)
and loaded from the published weights, so the resumed run generates what the
uninterrupted one did.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from gfcr.loop import context, plan_defaults
from gfcr.rollout import PROMPT_SCHEMA, col
from gfcr.stage import ALLOCATE, GENERATE, SELECT


def plan_ahead(rt: Any, run_id: str, step: int, history_step: int) -> tuple[Any, pa.Table]:
    """The context and round-0 plan of ``step``, as the loop would draw them, with the
    run's history as of ``history_step`` (the step under way: the newest one can see)."""
    ctx = context(rt, run_id, step)
    ctx.history = rt.history(history_step) if rt.history else None
    stages = rt.pipeline.stages
    table = PROMPT_SCHEMA.empty_table()
    for chooser in SELECT.of(stages):
        table = chooser.select(ctx, table)
    gen = GENERATE.of(stages)[0]
    for planner in ALLOCATE.of(stages):
        table = planner.allocate(ctx, plan_defaults(table, gen))
    return ctx, table


STEP_VERSION = "remote/step_version"
"""Step metric: the policy version at the start of the step (the one its calls sent
ahead generate with)."""


def version_sent(rt: Any, run_id: str, later: int, step: int) -> int | None:
    """The version an uninterrupted run generated step ``later``'s round-0 batch with,
    asked at ``step`` (the step under way): None when that is the current one (it was
    sent at ``step`` or later), else the one stored for step ``max(later - k, 0)`` (None
    when the store does not say: a step stored before the metric existed)."""
    source = max(later - rt.pipeline.max_staleness, 0)
    if source >= step or rt.history is None:
        return None
    table = rt.history(step).step_metrics(run_id)
    for row in table.select(["step", "metrics"]).to_pylist():
        if row["step"] == source:
            value = dict(row["metrics"] or {}).get(STEP_VERSION)
            return None if value is None else int(value)
    return None


def staleness(rollouts: pa.Table, version: int) -> dict[str, float]:
    """How many versions older than ``version`` (the step's) the weights that generated
    the step's rows were: mean and max over rows, 0 for a synchronous step."""
    start = rollouts.column(col.POLICY_VERSION_START).to_numpy(zero_copy_only=False)
    start = np.asarray(start, dtype=float)
    known = ~np.isnan(start)
    if not known.any():
        return {"staleness/mean": 0.0, "staleness/max": 0.0}
    lag = np.maximum(version - start[known], 0.0)
    return {"staleness/mean": float(lag.mean()), "staleness/max": float(lag.max())}
