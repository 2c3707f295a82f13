"""Reads the replay stages make from the rollout store, through the step's history.

Every read sees the run's rows at the snapshot the step's ``History`` is pinned to
(gfcr.storage.History; the loop pins it to the step before), so a resumed run — or a
stage called again later with the same history — reads exactly the rows the original
step read, whatever was committed since. Besides per-prompt totals, the replay stages
need evidence *discounted by age* and the rows themselves; the store implements those
reads (store.history), and nothing here knows its SQL dialect.

An *attempt* is what ``store.views`` calls one: a complete, scored, original
(``replay_count = 0``) rollout; a success is an attempt with ``reward > 0``.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from gfcr.rollout import ROLLOUT_SCHEMA, conform
from gfcr.storage import History


def prompt_evidence(history: History, *, now: int, half_life: float | None) -> pa.Table:
    """Per prompt: discounted attempts ``n`` and successes ``s``, and ``last_step``.

    An attempt at step ``t`` weighs ``0.5 ** ((now - t) / half_life)`` (1 when
    ``half_life`` is None), so the evidence of a policy long gone fades.
    """
    return history.prompt_evidence(now=now, half_life=half_life)


def as_rollouts(table: pa.Table, *, keep: tuple[str, ...] = ()) -> pa.Table:
    """DuckDB's result cast to ROLLOUT_SCHEMA, keeping only the extra columns ``keep``."""
    names = [n for n in table.column_names if n in ROLLOUT_SCHEMA.names or n in keep]
    return conform(table.select(names), where="stored rollouts")


def global_rate(evidence: pa.Table) -> float:
    """The run's (discounted) pass rate, smoothed by Beta(1, 1): 1/2 with no evidence."""
    n = float(np.sum(evidence.column("n").to_numpy())) if evidence.num_rows else 0.0
    s = float(np.sum(evidence.column("s").to_numpy())) if evidence.num_rows else 0.0
    return (1.0 + s) / (2.0 + n)
