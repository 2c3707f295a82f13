"""Reads the replay stages make from the rollout store, through the step's history.

Every read sees the run's rows at the snapshot the step's ``History`` is pinned to
(gfcr.core.storage.History; the loop pins it to the step before), so a resumed run — or a
stage called again later with the same history — reads exactly the rows the original
step read, whatever was committed since. Besides per-prompt totals, the replay stages
need evidence *discounted by age* and the rows themselves: they read the rows with a
typed filter (``History.rows``, gfcr.core.row_filter) and aggregate them here and in each
stage, in Arrow; nothing here knows the store's SQL dialect.

An *attempt* is what ``store.views`` calls one: a complete, scored, original
(``replay_count = 0``) rollout; a success is an attempt with ``reward > 0``.
"""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gfcr.core.rollout import ROLLOUT_SCHEMA, col, conform
from gfcr.core.row_filter import ATTEMPTS
from gfcr.core.storage import History


def prompt_evidence(history: History, *, now: int, half_life: float | None) -> pa.Table:
    """Per prompt (by prompt id): discounted attempts ``n`` and successes ``s``, and
    ``last_step``, aggregated here from the attempts' rows (prompt id, step, reward).

    An attempt at step ``t`` weighs ``0.5 ** ((now - t) / half_life)`` (1 when
    ``half_life`` is None), so the evidence of a policy long gone fades. The weights are
    computed once per distinct step, with the C library's ``pow``.
    """
    rows = history.rows(ATTEMPTS, columns=[col.PROMPT_ID, col.STEP, col.REWARD])
    steps = rows.column(col.STEP).to_numpy(zero_copy_only=False).astype(np.int64)
    distinct, where = np.unique(steps, return_inverse=True)
    per_step = np.array([1.0 if half_life is None else math.pow(0.5, (now - int(t)) / float(half_life))
                         for t in distinct], dtype=float)
    weight = per_step[where] if len(steps) else np.zeros(0)
    success = pc.fill_null(pc.greater(rows.column(col.REWARD), 0.0), False).to_numpy(zero_copy_only=False)
    parts = pa.table({"prompt_id": rows.column(col.PROMPT_ID), "n": pa.array(weight, pa.float64()),
                      "s": pa.array(np.where(success, weight, 0.0), pa.float64()),
                      "last_step": rows.column(col.STEP).cast(pa.int64())})
    grouped = parts.group_by("prompt_id", use_threads=False).aggregate(
        [("n", "sum"), ("s", "sum"), ("last_step", "max")])
    out = pa.table({"prompt_id": grouped.column("prompt_id"), "n": grouped.column("n_sum"),
                    "s": grouped.column("s_sum"), "last_step": grouped.column("last_step_max")})
    return out.sort_by("prompt_id")


def as_rollouts(table: pa.Table, *, keep: tuple[str, ...] = ()) -> pa.Table:
    """DuckDB's result cast to ROLLOUT_SCHEMA, keeping only the extra columns ``keep``."""
    names = [n for n in table.column_names if n in ROLLOUT_SCHEMA.names or n in keep]
    return conform(table.select(names), where="stored rollouts")


def global_rate(evidence: pa.Table) -> float:
    """The run's (discounted) pass rate, smoothed by Beta(1, 1): 1/2 with no evidence."""
    n = float(np.sum(evidence.column("n").to_numpy())) if evidence.num_rows else 0.0
    s = float(np.sum(evidence.column("s").to_numpy())) if evidence.num_rows else 0.0
    return (1.0 + s) / (2.0 + n)
