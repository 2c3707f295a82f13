"""How the loop applies a filter's result to a rollout table: keep masks become
``kept``/``dropped_by``/``drop_reason`` (rows are never removed), and a filter's subset of
rows is written back in place. The loop, the score pools and the what-if replay
(stages.replay.whatif) share it."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gfcr.core.rollout import col, conform
from gfcr.core.stage import FilterResult


def applied(result: FilterResult, label: str) -> pa.Table:
    if result.keep is None:
        return result.table
    keep = pa.array(result.keep, pa.bool_())
    if len(keep) != result.table.num_rows:
        raise ValueError(f"filter {label!r} returned a keep mask of {len(keep)} values for "
                         f"{result.table.num_rows} rows")
    reason = result.reason
    reasons = pa.array(reason if isinstance(reason, list) else [reason] * len(keep), pa.string())
    return drop(result.table, pc.invert(keep), label, reasons)


def drop(table: pa.Table, mask: Any, label: str, reasons: Any) -> pa.Table:
    """Mark rows where ``mask`` is true and that are still kept as dropped by ``label``.

    A row keeps the first stage that dropped it; rows are never removed.
    """
    newly = pc.and_(pc.fill_null(mask, False), table.column(col.KEPT))
    table = set_column(table, col.DROPPED_BY, pc.if_else(newly, label, table.column(col.DROPPED_BY)))
    table = set_column(table, col.DROP_REASON,
                 pc.if_else(newly, reasons, table.column(col.DROP_REASON)))
    return set_column(table, col.KEPT, pc.and_(table.column(col.KEPT), pc.invert(newly)))


def set_column(table: pa.Table, name: str, values: Any) -> pa.Table:
    """``table`` with column ``name`` (already in it) replaced by ``values``."""
    i = table.schema.get_field_index(name)
    return table.set_column(i, table.schema.field(i), values)


def merge_back(table: pa.Table, idx: np.ndarray, part: pa.Table) -> pa.Table:
    """Write the filtered subset's rows back at positions ``idx`` of ``table``."""
    if part.num_rows != len(idx):
        raise ValueError(f"a filter returned {part.num_rows} rows for {len(idx)}; filters "
                         "must not add or remove rows (return a keep mask instead)")
    if len(idx) == table.num_rows:
        return conform(part, where="filter output")
    rest = np.setdiff1d(np.arange(table.num_rows), idx)
    order = np.argsort(np.concatenate([idx, rest]), kind="stable")
    others = table.take(rest)
    for name in part.column_names:
        if name not in others.column_names:
            others = others.append_column(part.schema.field(name).with_nullable(True),
                                          pa.nulls(others.num_rows, part.schema.field(name).type))
    combined = pa.concat_tables([part, others.select(part.column_names)], promote_options="permissive")
    return conform(combined.take(order), where="filter output")
