"""The lake's tables: their Arrow schemas, their DDL, and schema evolution.

``rollouts`` is ``gfcr.core.rollout.ROLLOUT_SCHEMA`` (declared there, once); its DuckDB column
types are derived from the Arrow schema by DuckDB itself, so the two cannot drift.
``steps`` and ``runs`` belong to the store and are declared here.
"""

from __future__ import annotations

import duckdb
import pyarrow as pa

from gfcr.evaluation.columns import COMPLETION_SCHEMA
from gfcr.core.rollout import ROLLOUT_SCHEMA, SchemaError

from ._duck import quote_ident, rollback, with_retry
from ._location import StoreError

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
    pa.field("error", pa.string()),
])
"""One row per pipeline run: its spec, code version, status (running, finished, failed,
crashed, ...), when it ended and, for a run that did not finish, why (``error``)."""

EVALUATIONS_SCHEMA = pa.schema([
    pa.field("run_id", pa.string(), nullable=False),
    pa.field("step", pa.int64(), nullable=False),
    pa.field("label", pa.string(), nullable=False),
    pa.field("accuracy", pa.float64(), nullable=False),
    pa.field("n_prompts", pa.int64(), nullable=False),
    pa.field("temperature", pa.float64(), nullable=False),
    pa.field("max_tokens", pa.int64(), nullable=False),
    pa.field("evaluated_at", _TS, nullable=False),
    pa.field("eval_set", pa.string()),
    pa.field("samples", pa.int64()),
    pa.field("sample_temperature", pa.float64()),
    pa.field("mean_reward", pa.float64()),
    pa.field("pass_at", pa.map_(pa.int64(), pa.float64())),
])
"""One row per evaluation of a run on one evaluation set: after ``step`` training steps
(``label`` ``initial``: before the warm start, ``step=N`` otherwise), the share of
``n_prompts`` prompts answered with full credit, decoded at ``temperature`` (0: greedy)
with at most ``max_tokens`` tokens. ``eval_set`` is ``heldout`` for the task's held-out
split or an ``Evaluation.sets`` name (rows stored before schema version 3 are set to
``heldout`` by its migration). With a sampled evaluation: ``samples`` completions per prompt at
``sample_temperature``, their ``mean_reward`` and ``pass_at`` (k -> unbiased pass@k);
null otherwise. A run evaluated again under the same label and set (a resume) replaces
its row."""

EVAL_COMPLETIONS_SCHEMA = pa.schema(
    [pa.field("run_id", pa.string(), nullable=False),
     pa.field("step", pa.int64(), nullable=False),
     pa.field("label", pa.string(), nullable=False),
     pa.field("eval_set", pa.string(), nullable=False)] + list(COMPLETION_SCHEMA))
"""One row per completion an evaluation generated (``gfcr.evaluation.columns``): the
evaluation's run, step, label and set, then the prompt, sample and completion with its
reward. Replaced with its ``evaluations`` row (schema version 3)."""

VERSIONS_SCHEMA = pa.schema([
    pa.field("version", pa.int64(), nullable=False),
    pa.field("applied_at", _TS, nullable=False),
    pa.field("by", pa.string(), nullable=False),
])
"""One row per schema version a store was created at or migrated to (store._versions)."""

TABLES = {"rollouts": ROLLOUT_SCHEMA, "steps": STEPS_SCHEMA, "runs": RUNS_SCHEMA,
          "evaluations": EVALUATIONS_SCHEMA, "schema_versions": VERSIONS_SCHEMA,
          "eval_completions": EVAL_COMPLETIONS_SCHEMA}
ADDED_LATER = frozenset({"evaluations", "schema_versions", "eval_completions"})
"""Tables a store made by an older gfcr may lack: created when it is next opened for
writing, and not required to read it."""


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


def prepare(con: duckdb.DuckDBPyConnection, shown: str, *, writable: bool,
            alias: str = "lake") -> None:
    """Check that the attached lake is a gfcr store and bring it up to this version.

    A lake that holds tables but none of the store's is someone else's: refused, naming
    what it holds. A store missing newer tables or ``runs`` columns gets them when opened
    ``writable``; read-only, a store missing tables is refused.
    """
    present = sorted(r[0] for r in con.execute(
        "SELECT table_name FROM duckdb_tables() WHERE database_name = ?", [alias]).fetchall())
    missing = [name for name in TABLES if name not in present]
    if missing and present and len(missing) == len(TABLES):
        raise StoreError(f"{shown!r} is a DuckLake catalog but not a gfcr store: it holds "
                         f"table(s) {present[:8]} and none of {sorted(TABLES)}")
    required = [name for name in missing if name not in ADDED_LATER]
    if required and not writable:
        raise StoreError(f"{shown!r} is not a gfcr store: its catalog lacks table(s) {required}")
    if missing and writable:
        with_retry(lambda: create_tables(con, alias))
    if writable:
        with_retry(lambda: _add_runs_columns(con, alias))


def _add_runs_columns(con: duckdb.DuckDBPyConnection, alias: str) -> None:
    """Columns of RUNS_SCHEMA that a store made by an earlier gfcr lacks (nullable)."""
    have = lake_columns(con, "runs", alias)
    types = duckdb_types(con, RUNS_SCHEMA)
    for name in RUNS_SCHEMA.names:
        if name not in have:
            con.execute(f"ALTER TABLE {alias}.runs ADD COLUMN IF NOT EXISTS {quote_ident(name)} "
                        f"{types[name]}")


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
