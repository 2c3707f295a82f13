"""The shape of what the read side (report, doctor, ui) gets from the store's reads."""

from __future__ import annotations

from typing import Any

Row = dict[str, Any]
"""One stored row as plain values (pyarrow's ``to_pylist``), read by column name; the
store's schemas (gfcr.core.rollout, store.schema) say what each column holds."""
