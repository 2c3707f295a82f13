"""A :class:`gfcr.core.row_filter.RowFilter` as a DuckDB query: the WHERE clause, its bound
parameters, the projection, the order and the limit, so the scan of the Parquet files
skips what the reader does not want. Values are only ever bound parameters; the SQL
text holds column names (checked against the table's, then quoted) and fixed operators.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gfcr.core.row_filter import ASCENDING, DESCENDING, Order, RowFilter

from ._duck import quote_ident


def where(f: RowFilter, *, run_id: str | None) -> tuple[list[str], dict[str, Any]]:
    """The conditions of ``f`` (and the history's ``run_id`` when ``f`` names no runs),
    as SQL terms to AND, with their parameters."""
    terms: list[str] = []
    params: dict[str, Any] = {}

    def bind(value: Any) -> str:
        name = f"p{len(params)}"
        params[name] = value
        return f"${name}"

    def member(column: str, values: Sequence[str]) -> None:
        if len(values) == 1:  # an equality lets DuckDB skip files by their min/max
            terms.append(f"{column} = {bind(values[0])}")
        else:
            terms.append(f"list_contains({bind(list(values))}::VARCHAR[], {column})")

    runs = f.run_ids if f.run_ids is not None else (None if run_id is None else (run_id,))
    for column, values in (("run_id", runs), ("status", f.status), ("prompt_id", f.prompt_ids),
                           ("task", f.tasks), ("parent_id", f.parent_ids)):
        if values is not None:
            member(column, values)
    if f.exclude_runs:
        terms.append(f"NOT list_contains({bind(list(f.exclude_runs))}::VARCHAR[], run_id)")
    if f.step_min is not None:
        terms.append(f"step >= {bind(f.step_min)}")
    if f.step_max is not None:
        terms.append(f"step <= {bind(f.step_max)}")
    for column, flag, yes, no in (("kept", f.kept, "kept", "NOT kept"),
                                  ("reward", f.scored, "reward IS NOT NULL", "reward IS NULL"),
                                  ("replay_count", f.replayed, "replay_count > 0", "replay_count = 0"),
                                  ("consumed_at_step", f.consumed, "consumed_at_step IS NOT NULL",
                                   "consumed_at_step IS NULL")):
        if flag is not None:
            terms.append(yes if flag else no)
    if f.reward_above is not None:
        terms.append(f"reward > {bind(float(f.reward_above))}")
    if f.groups is not None:
        keys = [f"{run}\x00{group}" for run, group in f.groups]
        terms.append(f"list_contains({bind(keys)}::VARCHAR[], run_id || chr(0) || group_id)")
    return terms, params


def query(source: str, f: RowFilter, *, run_id: str | None, have: Sequence[str],
          columns: Sequence[str] | None, order_by: Order, limit: int | None) -> tuple[str, dict[str, Any]]:
    """``SELECT`` of ``columns`` (None: all) from ``source`` (a table with the columns
    ``have``) under ``f``, ordered and limited; ValueError names an unknown column, a bad
    direction or a negative limit."""
    known = set(have)
    if columns is not None and not columns:
        raise ValueError("rows: columns is empty; give None for every column")
    wanted = list(columns) if columns is not None else None
    unknown = [c for c in (wanted or []) + [c for c, _ in order_by] if c not in known]
    if unknown:
        raise ValueError(f"rows: no column(s) {sorted(set(unknown))} in the store's rollouts "
                         f"table (it has {sorted(known)})")
    for column, direction in order_by:
        if direction not in (ASCENDING, DESCENDING):
            raise ValueError(f"rows: order_by direction {direction!r} of column {column!r} "
                             f"is not {ASCENDING!r} or {DESCENDING!r}")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise ValueError(f"rows: limit must be an integer >= 0, got {limit!r}")
    terms, params = where(f, run_id=run_id)
    select = "*" if wanted is None else ", ".join(quote_ident(c) for c in wanted)
    sql = f"SELECT {select} FROM {source}"
    if terms:
        sql += " WHERE " + " AND ".join(terms)
    if order_by:
        sql += " ORDER BY " + ", ".join(
            f"{quote_ident(c)} {'DESC' if d == DESCENDING else 'ASC'}" for c, d in order_by)
    if limit is not None:
        sql += f" LIMIT {int(limit)}"
    return sql, params
