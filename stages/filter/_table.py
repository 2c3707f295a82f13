"""Small Arrow helpers shared by the filters."""

from __future__ import annotations

import pyarrow as pa


def set_column(table: pa.Table, name: str, values: pa.Array) -> pa.Table:
    """``table`` with column ``name`` replaced by ``values``, or appended (an extra
    column a stage declares in ``writes``)."""
    if name in table.column_names:
        return table.set_column(table.column_names.index(name), pa.field(name, values.type),
                                values)
    return table.append_column(pa.field(name, values.type), values)
