"""Small Arrow helpers shared by the filters."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pyarrow as pa

from gfcr.core.rollout import col


def set_column(table: pa.Table, name: str, values: pa.Array) -> pa.Table:
    """``table`` with column ``name`` replaced by ``values``, or appended (an extra
    column a stage declares in ``writes``)."""
    if name in table.column_names:
        return table.set_column(table.column_names.index(name), pa.field(name, values.type),
                                values)
    return table.append_column(pa.field(name, values.type), values)


def scored_groups(table: pa.Table) -> tuple[np.ndarray, dict[str, list[int]]]:
    """The rows' rewards (NaN where unscored), and the row indices of each group's kept,
    scored rows in row order: what a filter that decides within groups works on."""
    reward = table.column(col.REWARD).to_numpy(zero_copy_only=False).astype(float)
    kept = table.column(col.KEPT).to_numpy(zero_copy_only=False)
    groups: dict[str, list[int]] = defaultdict(list)
    for i, g in enumerate(table.column(col.GROUP_ID).to_pylist()):
        if kept[i] and not np.isnan(reward[i]):
            groups[g].append(i)
    return reward, groups
