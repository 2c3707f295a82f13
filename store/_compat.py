"""Older stores read as the current schema: the one place that knows what each schema
version lacks and how it reads today.

A store opened for writing is migrated (``store._versions``); one opened read-only
cannot be, so its reader connections get temporary views, named like the tables, that
present today's tables (``store._tables.TABLES``) over what the store holds; DuckDB
resolves a temporary view before the attached lake's table of the same name, so every
reader (``gfcr sql``, the report, the doctor, ``gfcr runs``, the UI, export) reads one
schema whatever the store's version:

- a table the store lacks (``eval_completions`` before version 3, ``schema_versions``
  before version 2) reads as empty, with its columns;
- a column the store lacks reads as null, except the ones :data:`FILL` names: an
  ``evaluations`` row before version 3 reads with ``eval_set = 'heldout'`` (the split it
  evaluated, as the version 3 migration sets it);
- ``rollouts.turns`` of a row stored without turns (before version 4: every row before
  version 2, and the rows a version 2 or 3 store kept from version 1) reads as its
  single-turn form, :func:`derived_turns`: the SQL that the version 4 migration also
  stores, so a store reads the same before and after it is migrated.

A store of the current version needs none of this, and gets no view.
"""

from __future__ import annotations

from collections.abc import Collection
from functools import lru_cache

import duckdb

from gfcr.core.rollout import HINT_TOKENS, col

from ._duck import quote_ident
from ._tables import TABLES, duckdb_types

TURNS_STORED = 4
"""The schema version from which every stored row has its ``turns``: its migration
(``store._versions``) stores :func:`derived_turns` in the rows that lack them."""

FILL = {("evaluations", "eval_set"): "'heldout'"}
"""(table, column) -> the SQL value an older store's rows read for a column it lacks
(null where not named)."""


@lru_cache(maxsize=None)
def types(table: str) -> dict[str, str]:
    """DuckDB's column types of store table ``table`` (a fixed function of its Arrow
    schema; found on a connection of its own, since a sandboxed one may not scan Arrow)."""
    con = duckdb.connect()
    try:
        return duckdb_types(con, TABLES[table])
    finally:
        con.close()


def derived_turns(columns: Collection[str]) -> str:
    """SQL for a row's turns in its single-turn form, from the flat columns of a
    ``rollouts`` table with ``columns``, as ``gfcr.core.turncols.single_turns`` derives it:
    the prompt (user, environment), the first ``hint_tokens`` completion tokens as a
    forced prefix (assistant, out of the loss; no turn when 0) and the rest as the
    policy's turn (in the loss), each assistant turn with its share of ``logprobs``."""
    hint = f"coalesce({quote_ident(HINT_TOKENS)}, 0)" if HINT_TOKENS in columns else "0"
    h = f"least(greatest({hint}, 0), len(completion_ids))"
    h_lp = f"least({h}, len(logprobs))"

    def turn(role: str, source: str, ids: str, logprobs: str, mask: str) -> str:
        return (f"{{'role': '{role}', 'source': '{source}', 'token_ids': {ids}, "
                f"'logprobs': {logprobs}, 'mask': {mask}, 'tool_name': NULL::VARCHAR, "
                f"'tool_error': NULL::VARCHAR, 'reward': NULL::DOUBLE}}")
    prompt = turn("user", "environment", "prompt_ids", "NULL::FLOAT[]", "NULL::BOOLEAN[]")
    forced = turn("assistant", "forced", f"completion_ids[1:{h}]", f"logprobs[1:{h_lp}]",
                  f"list_transform(range({h}), lambda i: false)")
    policy = turn("assistant", "policy", f"completion_ids[{h} + 1:]", f"logprobs[{h_lp} + 1:]",
                  f"list_transform(range(len(completion_ids) - {h}), lambda i: true)")
    return (f"list_concat([{prompt}], CASE WHEN {h} > 0 THEN [{forced}] ELSE [] END, "
            f"[{policy}])::{types('rollouts')[col.TURNS]}")


def views(con: duckdb.DuckDBPyConnection, version: int, alias: str = "lake") -> dict[str, str]:
    """Table name -> the ``SELECT`` of the temporary view that presents today's table
    over the lake ``alias`` of schema ``version`` (none for a table that reads as it is)."""
    present: dict[str, dict[str, str]] = {}
    for table, name, kind in con.execute(
            "SELECT table_name, column_name, data_type FROM duckdb_columns() "
            "WHERE database_name = ? ORDER BY column_index", [alias]).fetchall():
        present.setdefault(table, {})[name] = kind
    selects = {table: select(table, present.get(table), version, f"{alias}.{table}")
               for table in TABLES}
    return {table: sql for table, sql in selects.items() if sql is not None}


def select(table: str, have: Collection[str] | None, version: int, source: str) -> str | None:
    """A ``SELECT`` of today's ``table`` over ``source`` (the table of a store of schema
    ``version``, or it as of an earlier snapshot) with columns ``have`` (None: no such
    table), or None where it reads as it is."""
    want = types(table)
    if have is None:
        nulls = ", ".join(f"NULL::{kind} AS {quote_ident(name)}" for name, kind in want.items())
        return f"SELECT {nulls} WHERE false"
    turns = table == "rollouts" and version < TURNS_STORED
    if set(want) <= set(have) and not turns:
        return None
    parts = [quote_ident(name) if name in have
             else f"{FILL.get((table, name), 'NULL')}::{kind} AS {quote_ident(name)}"
             for name, kind in want.items()]
    if turns:
        derived = derived_turns(have)
        parts[list(want).index(col.TURNS)] = (
            f"coalesce(turns, {derived}) AS turns" if col.TURNS in have else f"{derived} AS turns")
    parts += [quote_ident(name) for name in have if name not in want]
    return f"SELECT {', '.join(parts)} FROM {source}"
