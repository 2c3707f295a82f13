"""The body of a step commit: what runs inside the one DuckLake transaction.

Large steps are written by ``pyarrow.parquet.write_table`` into the lake's data folder
(in a thread, while the transaction starts and checks the step) and registered inside
the transaction with ``ducklake_add_data_files``:
DuckDB's Parquet writer is several times slower than pyarrow's on list columns (token
ids, logprobs), and registration is what makes the file part of the lake, atomically
with the ``steps`` row. A file whose transaction does not commit is deleted; one left
behind by a killed process is never registered, so it is invisible (an orphan that
DuckLake's ``ducklake_delete_orphaned_files`` can remove). Small steps are INSERTed,
which lets DuckLake inline the tiniest ones into the catalog instead of writing a file.
Token-id, logprob and completion columns are written without dictionary encoding: for
them it costs a third of the write time and saves ~20% of the bytes, which
``store.maintenance.compact`` (DuckDB's writer) wins back when it merges files.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from gfcr.core.rollout import col

from . import _tables
from ._duck import Catalog, scalar

COMMIT_AUTHOR = "gfcr"
STAGE_MIN_ROWS = 256
"""Steps with at least this many rows are staged as a Parquet file, smaller ones INSERTed."""


def commit_message(run_id: str, step: int) -> str:
    """The DuckLake commit message of a step's snapshot (how a step finds its snapshot)."""
    return f"step {step} of run {run_id}"


def stage_async(catalog: Catalog, table: pa.Table,
                pool: ThreadPoolExecutor) -> Callable[[], Path | None]:
    """Start writing ``table``'s staged file on ``pool``; return a function that waits for it.

    pyarrow releases the GIL while writing, so the file is written while the commit
    transaction begins and checks the step (the catalog round trips), not after.
    """
    if table.num_rows < STAGE_MIN_ROWS or "://" in catalog.data_path:
        return lambda: None
    return pool.submit(stage, catalog, table).result


def stage(catalog: Catalog, table: pa.Table) -> Path:
    """Write ``table`` as a Parquet file under the data path (not yet part of the lake)."""
    folder = Path(catalog.data_path) / "main" / "rollouts"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"gfcr-{uuid.uuid4()}.parquet"
    plain = {col.COMPLETION} | {f.name for f in table.schema if pa.types.is_list(f.type)}
    pq.write_table(table, path, use_dictionary=[n for n in table.column_names if n not in plain])
    return path


def discard(staged_file: Callable[[], Path | None]) -> None:
    """Delete the staged file (once written) that no committed transaction registered."""
    try:
        path = staged_file()
    except Exception:  # the write itself failed; whatever it left is not registered
        return
    if path is not None:
        path.unlink(missing_ok=True)


def is_committed(con: duckdb.DuckDBPyConnection, run_id: str, step: int) -> bool:
    """Whether (run, step) has its ``steps`` row, as this connection's transaction sees it."""
    return bool(scalar(con, "SELECT count(*) FROM lake.steps WHERE run_id = ? AND step = ?",
                       [run_id, step]))


def body(con: duckdb.DuckDBPyConnection, table: pa.Table, step_row: pa.Table,
         staged_file: Callable[[], Path | None], *, evolve: bool = True) -> bool:
    """Inside a transaction: write the step unless its ``steps`` row exists. True if written.

    ``staged_file`` returns the step's staged Parquet file (None: INSERT instead).
    ``evolve=False`` skips matching the table's columns against the store's (two catalog
    queries), for a schema this connection has committed before.
    """
    run_id, step = step_row["run_id"][0].as_py(), step_row["step"][0].as_py()
    if is_committed(con, run_id, step):
        return False
    staged = staged_file()
    for statement in _tables.evolve_sql(con, table) if evolve else ():
        con.execute(statement)
    if staged is None:
        con.register("_gfcr_batch", table)
        con.execute("INSERT INTO lake.rollouts BY NAME SELECT * FROM _gfcr_batch")
    else:
        con.execute("CALL ducklake_add_data_files('lake', 'rollouts', ?, allow_missing => true)", [str(staged)])
    con.register("_gfcr_step", step_row)
    con.execute("INSERT INTO lake.steps BY NAME SELECT * FROM _gfcr_step")
    extra = json.dumps({"run_id": run_id, "step": step, "rows": table.num_rows})
    con.execute("CALL lake.set_commit_message(?, ?, extra_info => ?)",
                [COMMIT_AUTHOR, commit_message(run_id, step), extra])
    return True


def last_committed_snapshot(con: duckdb.DuckDBPyConnection) -> int:
    """The snapshot this connection's DuckDB instance committed last (its own commit)."""
    return int(str(scalar(con, "SELECT * FROM lake.last_committed_snapshot()")))


def step_snapshot(con: duckdb.DuckDBPyConnection, run_id: str, step: int) -> int | None:
    """The snapshot id whose commit message names (run, step), or None."""
    row = con.execute("SELECT max(snapshot_id) FROM lake.snapshots() WHERE commit_message = ?",
                      [commit_message(run_id, step)]).fetchone()
    return None if row is None else row[0]
