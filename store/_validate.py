"""Checks a step's rollouts pass before anything is written.

``gfcr.core.rollout.conform`` fixes the schema (and raises ``SchemaError`` naming each bad
column); the checks here are about values the schema cannot express: rewards must be
finite, and every row must belong to the (run, step) being committed, since a row filed
under another step would break exactly-once accounting.
"""

from __future__ import annotations

from collections.abc import Mapping

import pyarrow as pa
import pyarrow.compute as pc

from gfcr.core.rollout import col, conform


def batch(rollouts: pa.Table, run_id: str, step: int) -> pa.Table:
    """``rollouts`` conformed to ROLLOUT_SCHEMA; ValueError if values are unusable."""
    if not isinstance(rollouts, pa.Table):
        raise TypeError(f"rollouts must be a pyarrow.Table, got {type(rollouts).__name__}")
    table = conform(rollouts, where=f"rollouts of run {run_id!r} step {step}")
    problems: list[str] = []
    _count(problems, col.REWARD, _not_finite(table.column(col.REWARD)), "NaN or infinite value(s)")
    rewards = table.column(col.REWARDS)
    items = pa.chunked_array([chunk.items for chunk in rewards.chunks], type=pa.float64())
    _count(problems, col.REWARDS, _not_finite(items), "NaN or infinite value(s)")
    _count(problems, col.RUN_ID, _differs(table.column(col.RUN_ID), run_id), f"row(s) whose run_id is not {run_id!r}")
    _count(problems, col.STEP, _differs(table.column(col.STEP), step), f"row(s) whose step is not {step}")
    _count(problems, col.ROLLOUT_ID, table.num_rows - pc.count_distinct(table.column(col.ROLLOUT_ID)).as_py(),
           "duplicate rollout id(s)")
    if problems:
        raise ValueError(f"rollouts of run {run_id!r} step {step} rejected, nothing written: "
                         + "; ".join(problems))
    return table


def metrics(values: Mapping[str, float]) -> dict[str, float]:
    """``values`` as a str -> float dict; ValueError naming a key whose value is not a number."""
    out: dict[str, float] = {}
    for key, value in dict(values).items():
        if not isinstance(key, str):
            raise ValueError(f"metric name {key!r} is not a string")
        try:
            out[key] = float(value)
        except (TypeError, ValueError):
            raise ValueError(f"metric {key!r} has value {value!r}, expected a number") from None
    return out


def _count(problems: list[str], column: str, n: int, what: str) -> None:
    if n:
        problems.append(f"column {column!r} has {n} {what}")


def _not_finite(values: pa.ChunkedArray) -> int:
    if len(values) == 0:
        return 0
    bad = pc.invert(pc.is_finite(values))
    return pc.sum(pc.fill_null(bad, False)).as_py() or 0


def _differs(values: pa.ChunkedArray, expected: object) -> int:
    if len(values) == 0:
        return 0
    return pc.sum(pc.fill_null(pc.not_equal(values, pa.scalar(expected, values.type)), True)).as_py() or 0
