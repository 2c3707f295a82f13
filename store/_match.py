"""Typed row filters for ``export``: column = value conditions, never SQL text.

``gfcr store export`` once spliced its ``--where`` text into a query on an unconfined
connection, so a condition could read (and export) any file the user could. Now a filter
is a mapping of column names to values: each name must be a column of the exported table,
each value is converted to that column's type here (a value that does not convert is
refused, naming the column), and the query binds it as a parameter. A ``(low, high)``
pair on a numeric column is an inclusive range (``--step 3:7``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from ._duck import quote_ident

_TRUE, _FALSE = {"true", "1", "yes", "t"}, {"false", "0", "no", "f"}


def where_clause(schema: pa.Schema, match: Mapping[str, Any] | None) -> tuple[str, list[Any]]:
    """`` WHERE ...`` (or ``""``) and its parameters for ``match`` on a table of ``schema``;
    ValueError naming the column for an unknown column or a value of the wrong type."""
    if not match:
        return "", []
    parts: list[str] = []
    params: list[Any] = []
    for name, value in match.items():
        if name not in schema.names:
            raise ValueError(f"cannot filter on {name!r}: the table has no such column "
                             f"(columns: {', '.join(schema.names)})")
        kind = schema.field(name).type
        column = quote_ident(name)
        if isinstance(value, tuple) and len(value) == 2 and _numeric(kind):
            low, high = (_typed(name, kind, v) for v in value)
            parts.append(f"{column} BETWEEN ? AND ?")
            params += [low, high]
        else:
            parts.append(f"{column} = ?")
            params.append(_typed(name, kind, value))
    return " WHERE " + " AND ".join(parts), params


def _numeric(kind: pa.DataType) -> bool:
    return bool(pa.types.is_integer(kind) or pa.types.is_floating(kind))


def _typed(name: str, kind: pa.DataType, value: Any) -> Any:
    """``value`` as a value of the column's type; ValueError naming the column if not."""
    text = str(value).strip()
    try:
        if pa.types.is_boolean(kind):
            if isinstance(value, bool):
                return value
            if text.lower() in _TRUE | _FALSE:
                return text.lower() in _TRUE
            raise ValueError
        if pa.types.is_integer(kind):
            if isinstance(value, bool):
                raise ValueError
            return int(text)
        if pa.types.is_floating(kind):
            number = float(text)
            if not math.isfinite(number):
                raise ValueError
            return number
        if pa.types.is_string(kind) or pa.types.is_large_string(kind):
            return str(value)
    except ValueError:
        raise ValueError(f"cannot filter {name!r} (type {kind}) on {value!r}: not a "
                         f"{'finite number' if _numeric(kind) else kind} value") from None
    raise ValueError(f"cannot filter on {name!r}: its type {kind} takes no equality filter "
                     "(strings, numbers and booleans do)")
