"""The lake's tables: their Arrow schemas, their DDL, and schema evolution.

``rollouts`` is ``gfcr.rollout.ROLLOUT_SCHEMA`` (declared there, once); its DuckDB column
types are derived from the Arrow schema by DuckDB itself, so the two cannot drift.
``steps`` and ``runs`` belong to the store and are declared here.
"""

from __future__ import annotations

import duckdb
import pyarrow as pa

from gfcr.rollout import ROLLOUT_SCHEMA, SchemaError

from ._duck import quote_ident, rollback

_TS = pa.timestamp("us", tz="UTC")

STEPS_SCHEMA = pa.schema([
    pa.field("run_id", pa.string(), nullable=False),
    pa.field("step", pa.int64(), nullable=False),
    pa.field("policy_version", pa.int64(), nullable=False),
    pa.field("n_rollouts", pa.int64(), nullable=False),
    pa.field("n_kept", pa.int64(), nullable=False),
    pa.field("metrics", pa.map_(pa.string(), pa.float64())),
    pa.field("committed_at", _TS, nullable=False),
])
"""One row per committed step; its presence is what makes a step committed."""

RUNS_SCHEMA = pa.schema([
    pa.field("run_id", pa.string(), nullable=False),
    pa.field("pipeline", pa.string(), nullable=False),
    pa.field("spec_yaml", pa.string(), nullable=False),
    pa.field("spec_hash", pa.string(), nullable=False),
    pa.field("code_version", pa.string(), nullable=False),
    pa.field("status", pa.string(), nullable=False),
    pa.field("started_at", _TS, nullable=False),
    pa.field("finished_at", _TS),
    pa.field("store", pa.string(), nullable=False),
])
"""One row per pipeline run: its spec, code version and status."""

TABLES = {"rollouts": ROLLOUT_SCHEMA, "steps": STEPS_SCHEMA, "runs": RUNS_SCHEMA}


def duckdb_types(con: duckdb.DuckDBPyConnection, schema: pa.Schema) -> dict[str, str]:
    """DuckDB's column type for each field of ``schema``, as DuckDB maps Arrow types."""
    con.register("_gfcr_schema_probe", schema.empty_table())
    try:
        rows = con.execute("DESCRIBE SELECT * FROM _gfcr_schema_probe").fetchall()
    finally:
        con.unregister("_gfcr_schema_probe")
    return {name: kind for name, kind, *_ in rows}


def create_sql(con: duckdb.DuckDBPyConnection, name: str, schema: pa.Schema) -> str:
    """``CREATE TABLE IF NOT EXISTS`` for ``schema``, with NOT NULL where it says so."""
    types = duckdb_types(con, schema)
    columns = ", ".join(
        f"{quote_ident(f.name)} {types[f.name]}{'' if f.nullable else ' NOT NULL'}"
        for f in schema)
    return f"CREATE TABLE IF NOT EXISTS {name} ({columns})"


def missing_tables(con: duckdb.DuckDBPyConnection, alias: str = "lake") -> list[str]:
    """Names of the store's tables that the attached lake lacks."""
    present = {row[0] for row in con.execute(
        "SELECT table_name FROM duckdb_tables() WHERE database_name = ?", [alias]).fetchall()}
    return [name for name in TABLES if name not in present]


def create_tables(con: duckdb.DuckDBPyConnection, alias: str = "lake") -> None:
    """Create the missing tables in one transaction (one snapshot)."""
    statements = [create_sql(con, f"{alias}.{name}", TABLES[name]) for name in missing_tables(con, alias)]
    if not statements:
        return
    con.execute("BEGIN")
    try:
        for statement in statements:
            con.execute(statement)
        con.execute("COMMIT")
    except BaseException:
        rollback(con)
        raise


def lake_columns(con: duckdb.DuckDBPyConnection, table: str, alias: str = "lake") -> dict[str, str]:
    """Column name -> DuckDB type of a lake table, as the current transaction sees it."""
    rows = con.execute(
        "SELECT column_name, data_type FROM duckdb_columns() "
        "WHERE database_name = ? AND table_name = ? ORDER BY column_index", [alias, table]).fetchall()
    return dict(rows)


def evolve_sql(con: duckdb.DuckDBPyConnection, batch: pa.Table, alias: str = "lake") -> list[str]:
    """``ALTER TABLE … ADD COLUMN`` for each column of ``batch`` that ``rollouts`` lacks.

    New columns are nullable, so rows committed before read them as null. A column that
    exists with another type raises ``SchemaError`` naming it and both types.
    """
    have = lake_columns(con, "rollouts", alias)
    want = duckdb_types(con, batch.schema)
    statements, problems = [], []
    for name in batch.column_names:
        if name not in have:
            statements.append(f"ALTER TABLE {alias}.rollouts ADD COLUMN {quote_ident(name)} {want[name]}")
        elif have[name] != want[name]:
            problems.append(f"column {name!r} has type {want[name]}, the store has {have[name]}")
    if problems:
        raise SchemaError("rollouts do not match the store's rollouts table: " + "; ".join(problems))
    return statements


def as_rollout_schema(table: pa.Table) -> pa.Table:
    """``table`` (as DuckDB returns it) cast to the exact fields of ROLLOUT_SCHEMA.

    DuckDB names list children differently and drops NOT NULL from Arrow fields; stages
    expect the declared schema. Extra columns keep their types.
    """
    fields = [ROLLOUT_SCHEMA.field(name) if name in ROLLOUT_SCHEMA.names else table.schema.field(name)
              for name in table.column_names]
    return table.cast(pa.schema(fields))
