"""The store's schema version, and the migrations that bring an older store up to it.

A store records each schema version it was brought to in its ``schema_versions`` table
(``_tables.VERSIONS_SCHEMA``: one row per migration applied, the version, when, by
which gfcr). Its version is the
highest recorded; a store without the table was written before versions were recorded
and is version 1. Opening a store:

- of a *newer* version than :data:`SCHEMA_VERSION` is refused, read-only or not, with a
  message naming both versions: this gfcr would misread columns it does not know;
- of an *older* version for writing migrates it, one version at a time, each migration
  and its ``schema_versions`` row in one transaction (a crash leaves the store at the
  version before or after, never between); migrations are idempotent, so two processes
  opening the store at once both succeed;
- of an older version read-only reads it as this version, without writing to it:
  ``store._compat`` presents today's tables over it (the turns of rows stored without
  them derived, columns it lacks null).

Versions:

1. the store as gfcr wrote it before versions were recorded;
2. ``rollouts.turns`` (``gfcr.core.trajectory.TURN_TYPE``): the trajectory as turns. Rows stored
   before kept a null ``turns`` until version 4.
3. evaluations beyond greedy held-out accuracy: ``evaluations`` gains ``eval_set``,
   ``samples``, ``sample_temperature``, ``mean_reward`` and ``pass_at`` (null in older
   rows, whose ``eval_set`` is set to ``heldout``: the split they evaluated), and the ``eval_completions`` table holds every
   evaluated completion (``_tables.EVAL_COMPLETIONS_SCHEMA``; created with the other
   missing tables when the store is opened for writing).
4. stored turns are the only source: every row stored without ``turns`` (the rows of
   version 1) gets its single-turn form stored (``store._compat.derived_turns``, as
   ``gfcr.core.turncols.single_turns`` derives it); no other column is changed, and
   DuckLake keeps the rows as they were for time travel. It is one ``UPDATE`` of the rows
   whose ``turns`` is null, so a migration interrupted before its commit left nothing
   and runs again whole, and one run twice changes nothing.

A store of an older version opened read-only reads as this version through
``store._compat``.
"""

from __future__ import annotations

from datetime import datetime, timezone
from importlib import metadata
from typing import Callable

import duckdb
import pyarrow as pa

from gfcr.core.rollout import ROLLOUT_SCHEMA, col

from ._compat import TURNS_STORED, derived_turns
from ._duck import quote_ident, rollback, scalar
from ._location import StoreError
from ._tables import EVALUATIONS_SCHEMA, VERSIONS_SCHEMA, duckdb_types, lake_columns

SCHEMA_VERSION = 4
"""The rollout schema version this gfcr writes and reads."""


def _add_turns(con: duckdb.DuckDBPyConnection, alias: str) -> None:
    kind = duckdb_types(con, pa.schema([ROLLOUT_SCHEMA.field(col.TURNS)]))[col.TURNS]
    con.execute(f"ALTER TABLE {alias}.rollouts ADD COLUMN IF NOT EXISTS "
                f"{quote_ident(col.TURNS)} {kind}")


def _add_eval_columns(con: duckdb.DuckDBPyConnection, alias: str) -> None:
    """The evaluations columns of version 3 (nullable; older rows keep nulls)."""
    types = duckdb_types(con, EVALUATIONS_SCHEMA)
    for name in _EVAL_COLUMNS:
        con.execute(f"ALTER TABLE {alias}.evaluations ADD COLUMN IF NOT EXISTS "
                    f"{quote_ident(name)} {types[name]}")
    # every evaluation before sets existed was of the held-out split
    con.execute(f"UPDATE {alias}.evaluations SET eval_set = 'heldout' WHERE eval_set IS NULL")


_EVAL_COLUMNS = ("eval_set", "samples", "sample_temperature", "mean_reward", "pass_at")
"""The columns version 3 added to ``evaluations``."""



def _store_turns(con: duckdb.DuckDBPyConnection, alias: str) -> None:
    """Version 4: the single-turn form stored in every row that has no ``turns``."""
    turns = quote_ident(col.TURNS)
    if not scalar(con, f"SELECT count(*) FROM {alias}.rollouts WHERE {turns} IS NULL"):
        return  # a new store, or one whose rows all have turns: nothing written
    derived = derived_turns(lake_columns(con, "rollouts", alias))
    con.execute(f"UPDATE {alias}.rollouts SET {turns} = {derived} WHERE {turns} IS NULL")


MIGRATIONS: dict[int, Callable[[duckdb.DuckDBPyConnection, str], None]] = {
    2: _add_turns, 3: _add_eval_columns, TURNS_STORED: _store_turns}
"""Version -> the statements that bring a store of the version before to it."""


def _gfcr() -> str:
    try:
        return f"gfcr {metadata.version('gfcr')}"
    except metadata.PackageNotFoundError:
        return "gfcr (not installed)"


def version(con: duckdb.DuckDBPyConnection, alias: str = "lake") -> int:
    """The attached store's schema version (1: it records none)."""
    present = con.execute("SELECT 1 FROM duckdb_tables() WHERE database_name = ? AND "
                          "table_name = 'schema_versions'", [alias]).fetchall()
    if not present:
        return 1
    found = con.execute(f"SELECT max(version) FROM {alias}.schema_versions").fetchone()
    return int(found[0]) if found and found[0] is not None else 1


def check(con: duckdb.DuckDBPyConnection, shown: str, alias: str = "lake") -> int:
    """The store's version; StoreError if it is newer than this gfcr's."""
    have = version(con, alias)
    if have > SCHEMA_VERSION:
        raise StoreError(
            f"store {shown!r} has rollout schema version {have}, newer than this gfcr's "
            f"{SCHEMA_VERSION}: it was written by a later gfcr; open it with that version "
            f"or newer (nothing was read or changed)")
    return have


def upgrade(con: duckdb.DuckDBPyConnection, shown: str, alias: str = "lake") -> None:
    """Bring a store opened for writing to :data:`SCHEMA_VERSION`, one migration (and its
    ``schema_versions`` row) per transaction."""
    for target in range(check(con, shown, alias) + 1, SCHEMA_VERSION + 1):
        con.execute("BEGIN")
        try:
            if version(con, alias) < target:  # another process may have migrated it
                MIGRATIONS[target](con, alias)
                con.execute(f"INSERT INTO {alias}.schema_versions VALUES (?, ?, ?)",
                            [target, datetime.now(timezone.utc), _gfcr()])
            con.execute("COMMIT")
        except BaseException:
            rollback(con)
            raise
