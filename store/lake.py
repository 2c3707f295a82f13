"""RolloutStore: every rollout of every run in a DuckLake (catalog + Parquet), via DuckDB.

A step commit writes the step's rollouts and its ``steps`` row in one DuckLake
transaction, so a step is whole or absent — also when the process is killed midway —
and readers never see half of one. The ``steps`` row is the commit marker: committing a
(run, step) that has one is a no-op that says so, which makes a retried or resumed step
safe. Large steps are written with pyarrow and registered in the transaction (see
``store._commit``). Several processes may commit to one store; catalog write conflicts
are retried with jittered backoff. Reads (``sql``, ``last_step``, ``store.history``) go through a
connection that attaches the catalog read-only, so they never block a writer and a
statement that writes cannot slip through a read path.

Exactly-once holds for retries and resumes (one committer per run at a time, as the
loop runs). Two processes racing to commit the *same* (run, step) at the same instant
are not serialised by DuckLake (concurrent appends do not conflict) and could both land.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from gfcr.core.rollout import col

from . import _catalog, _commit, _evals, _tables, _validate, _versions
from ._duck import Catalog, connect, rollback, scalar, with_retry
from ._guard import ReadOnlyError, check_read_only, excerpt, short
from ._location import StoreError, redact, resolve
from .views import create_views

__all__ = ["CommitResult", "ReadOnlyError", "RolloutStore", "StoreError"]


@dataclass(frozen=True)
class CommitResult:
    """Outcome of ``commit_step``: whether it wrote, how many rows, at which snapshot."""

    committed: bool
    rows: int
    snapshot: int | None
    message: str


class RolloutStore:
    """A rollout store opened from a folder or a PostgreSQL catalog; see ``open``."""

    def __init__(self, uri: str, catalog: Catalog, con: duckdb.DuckDBPyConnection, *, read_only: bool):
        self.uri = uri
        self.catalog = catalog
        self.read_only = read_only
        self._con = con
        self._reader: duckdb.DuckDBPyConnection | None = con if read_only else None
        self._query_con: duckdb.DuckDBPyConnection | None = None
        self._lock = threading.RLock()
        self._stager: ThreadPoolExecutor | None = None  # writes staged files (_commit)
        self._guards: dict[str, Callable[[], None]] = {}
        """Per run id, a check every write of that run calls first (its lease: store.lease)."""
        self._committed_schemas: set[pa.Schema] = set()
        """Schemas of batches committed through this store: the rollouts table has their
        columns with their types (columns are only ever added), so a batch of one of them
        is not matched against the catalog again (4-7 ms of a commit's CPU)."""

    @classmethod
    def open(cls, uri: str | os.PathLike[str], *, read_only: bool = False, create: bool = True,
             data_path: str | os.PathLike[str] | None = None) -> RolloutStore:
        """Open (or, unless ``create=False`` or read-only, create) the store at ``uri``.

        ``uri`` is a folder (SQLite catalog ``catalog.sqlite`` and Parquet under ``data/``)
        or a ``postgres://``/``postgresql://`` DSN, which needs ``data_path=``. A folder
        that exists but is not a store, or a missing store that may not be created,
        raises ``StoreError`` naming the path.
        """
        catalog, new = resolve(uri, data_path=data_path, read_only=read_only, create=create)
        shown = redact(os.fspath(uri))
        try:
            if new and catalog.kind == "sqlite":
                with_retry(lambda: _build_folder_catalog(catalog))
            con = with_retry(lambda: connect(catalog, read_only=read_only))
        except duckdb.Error as exc:
            raise StoreError(f"cannot open store {shown!r}: {exc}") from exc
        try:
            writable = not read_only and (create or new)
            _versions.check(con, shown)
            _tables.prepare(con, shown, writable=writable)
            if writable:
                with_retry(lambda: _versions.upgrade(con, shown))
            create_views(con)
        except BaseException:
            con.close()
            raise
        return cls(shown, catalog, con, read_only=read_only)

    def __enter__(self) -> RolloutStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the store's connections; the store cannot be used afterwards."""
        with self._lock:
            cons = (self._con, self._reader, self._query_con)
            for con in {id(c): c for c in cons if c is not None}.values():
                con.close()
            self._reader = self._query_con = None
            if self._stager is not None:
                self._stager.shutdown()
                self._stager = None

    def __repr__(self) -> str:
        mode = "read-only" if self.read_only else "read-write"
        return f"RolloutStore({self.uri!r}, {mode})"

    # -- runs ---------------------------------------------------------------------------

    def start_run(self, run_id: str, *, pipeline: str, spec_yaml: str, spec_hash: str,
                  code_version: str) -> bool:
        """Record a new run; return False (and mark it running again) if it exists (a resume)."""
        self._writable("start_run")
        self._check_guard(run_id)
        row = pa.table({"run_id": [run_id], "pipeline": [pipeline], "spec_yaml": [spec_yaml],
                        "spec_hash": [spec_hash], "code_version": [code_version],
                        "status": ["running"], "started_at": [_now()], "finished_at": [None],
                        "store": [self.uri], "error": [None]}, schema=_tables.RUNS_SCHEMA)

        def attempt() -> bool:
            def body(con: duckdb.DuckDBPyConnection) -> bool:
                if _run_exists(con, run_id):
                    con.execute("UPDATE lake.runs SET status = 'running', finished_at = NULL, "
                                "error = NULL WHERE run_id = ? AND status <> 'running'", [run_id])
                    return False
                con.register("_gfcr_run", row)
                con.execute("INSERT INTO lake.runs BY NAME SELECT * FROM _gfcr_run")
                return True
            return self._transaction(body)
        with self._lock:
            return with_retry(attempt)

    def finish_run(self, run_id: str, status: str, error: str | None = None) -> None:
        """Set the run's final ``status`` (e.g. "finished", "failed", "crashed"),
        ``finished_at`` and, for a run that did not finish, why (``error``)."""
        self._writable("finish_run")
        self._check_guard(run_id)  # a run that lost its lease leaves the status to the new owner

        def body(con: duckdb.DuckDBPyConnection) -> None:
            if not _run_exists(con, run_id):
                raise StoreError(f"no run {run_id!r} in store {self.uri!r}; call start_run first")
            con.execute("UPDATE lake.runs SET status = ?, finished_at = ?, error = ? "
                        "WHERE run_id = ?", [status, _now(), error, run_id])
        with self._lock:
            with_retry(lambda: self._transaction(body))

    def record_evaluation(self, run_id: str, step: int, label: str, *, accuracy: float,
                          n_prompts: int, temperature: float, max_tokens: int,
                          eval_set: str = "heldout", sampled: dict[str, Any] | None = None,
                          completions: pa.Table | None = None) -> None:
        """Record an evaluation in ``evaluations`` (and its ``completions``,
        ``gfcr.evaluation.columns.COMPLETION_SCHEMA``, in ``eval_completions``), replacing the
        run's rows of the same ``label`` and ``eval_set`` (a resumed run that evaluates
        again stores them once). ``sampled``: see ``store._evals.evaluation_row``."""
        self._writable("record_evaluation")
        self._check_guard(run_id)
        row = _evals.evaluation_row(run_id, step, label, _now(), accuracy=accuracy,
                                    n_prompts=n_prompts, temperature=temperature,
                                    max_tokens=max_tokens, eval_set=eval_set, sampled=sampled)
        rows = None if completions is None else _evals.completion_rows(
            run_id, step, label, eval_set, completions)
        with self._lock:
            with_retry(lambda: self._transaction(
                lambda con: _evals.replace_evaluation(con, row, rows)))

    def set_guard(self, run_id: str, check: Callable[[], None] | None) -> None:
        """Make every write of ``run_id`` (its status, steps, evaluations) call ``check``
        first (None: no more)."""
        if check is None:
            self._guards.pop(run_id, None)
        else:
            self._guards[run_id] = check

    # -- steps --------------------------------------------------------------------------

    def commit_step(self, run_id: str, step: int, rollouts: pa.Table, *, policy_version: int,
                    metrics: dict[str, float]) -> CommitResult:
        """Commit one step's rollouts and its ``steps`` row in one transaction, exactly once.

        Validates first (``SchemaError`` for schema problems, ``ValueError`` for NaN/inf
        rewards or rows of another run or step); nothing is written if that fails.
        Extra columns become new nullable columns of ``rollouts``.
        """
        self._writable("commit_step")
        self._check_guard(run_id)
        table = _validate.batch(rollouts, run_id, step)
        step_row = pa.table({
            "run_id": [run_id], "step": [step], "policy_version": [policy_version],
            "n_rollouts": [table.num_rows], "n_kept": [pc.sum(table.column(col.KEPT)).as_py() or 0],
            "metrics": [list(_validate.metrics(metrics).items())], "committed_at": [_now()],
        }, schema=_tables.STEPS_SCHEMA)
        with self._lock:
            committed = self._commit(table, step_row)
            snapshot = (_commit.last_committed_snapshot(self._con) if committed
                        else _commit.step_snapshot(self._con, run_id, step))
        if not committed:
            return CommitResult(False, 0, snapshot, f"step {step} of run {run_id!r} is already committed "
                                                    f"(snapshot {snapshot}); nothing written")
        return CommitResult(True, table.num_rows, snapshot,
                            f"committed step {step} of run {run_id!r}: {table.num_rows} rollouts")

    def last_step(self, run_id: str) -> int | None:
        """The highest committed step of ``run_id``, or None if it has none."""
        with self._lock:
            row = self._read().execute("SELECT max(step) FROM steps WHERE run_id = ?", [run_id]).fetchone()
        return None if row is None else row[0]

    # -- reading ------------------------------------------------------------------------

    def sql(self, query: str, params: list[Any] | dict[str, Any] | None = None) -> pa.Table:
        """Run read-only SQL; tables and views resolve without a prefix. Returns Arrow.

        A statement that may write raises ``ReadOnlyError`` naming its type. With several
        statements, the last one's result is returned.
        """
        statements = check_read_only(query)
        with self._lock:
            con = self._query()
            try:
                for statement in statements[:-1]:
                    con.execute(statement)
                return con.execute(statements[-1], params).to_arrow_table()
            except duckdb.Error as exc:
                if "read-only mode" not in str(exc):
                    raise
                raise ReadOnlyError(f"the store is read-only through this path: "
                                    f"{excerpt(query)} tried to write ({short(exc)})") from exc

    def interrupt(self) -> None:
        """Stop the statement ``sql`` is running (call it from another thread: Ctrl-C)."""
        con = self._query_con
        if con is not None:
            con.interrupt()

    def read_rollouts(self, where: str | None = None, params: list[Any] | None = None) -> pa.Table:
        """Rollouts (optionally ``WHERE where``) as a table in ROLLOUT_SCHEMA (+ extra columns),
        with their stored turns (a store older than that, read-only: their single-turn
        form, store._compat)."""
        query = "SELECT * FROM rollouts" + (f" WHERE {where}" if where else "")
        if len(check_read_only(query)) != 1:
            raise ValueError(f"where clause {where!r} must not contain several statements")
        with self._lock:  # the sandboxed connection: ``where`` is SQL text
            table = self._query().execute(query, params).to_arrow_table()
        return _tables.as_rollout_schema(table)

    def snapshots(self) -> pa.Table:
        """DuckLake's snapshot list (id, time, schema version, changes, author, message)."""
        with self._lock:
            return self._read().execute("SELECT * FROM lake.snapshots() ORDER BY snapshot_id").to_arrow_table()

    def step_snapshot(self, run_id: str, step: int) -> int | None:
        """The DuckLake snapshot id that committed ``step`` of ``run_id`` (None if not committed)."""
        with self._lock:
            return _commit.step_snapshot(self._read(), run_id, step)

    def connection(self) -> duckdb.DuckDBPyConnection:
        """The read-only DuckDB connection (for ``store.history``); do not close it."""
        return self._read()

    # -- internals ----------------------------------------------------------------------

    def _check_guard(self, run_id: str) -> None:
        guard = self._guards.get(run_id)
        if guard is not None:
            guard()

    def _writable(self, what: str) -> None:
        if self.read_only:
            raise ReadOnlyError(f"store {self.uri!r} is open read-only; {what} needs read_only=False")

    def _query(self) -> duckdb.DuckDBPyConnection:
        """The connection ``sql`` runs user SQL on: read-only, and sandboxed (no file
        outside the store, no network, settings locked; store._duck.connect)."""
        if self._query_con is None:
            self._query_con = with_retry(lambda: connect(self.catalog, read_only=True,
                                                         sandbox=True))
            create_views(self._query_con)
        return self._query_con

    def _read(self) -> duckdb.DuckDBPyConnection:
        if self._reader is None:
            self._reader = with_retry(lambda: connect(self.catalog, read_only=True))
            create_views(self._reader)
        return self._reader

    def _commit(self, table: pa.Table, step_row: pa.Table) -> bool:
        """Run the commit transaction with retries; remove a staged file no commit registered."""
        if self._stager is None:
            self._stager = ThreadPoolExecutor(1, thread_name_prefix="gfcr-stage")
        staged_file = _commit.stage_async(self.catalog, table, self._stager)
        evolve = table.schema not in self._committed_schemas
        try:
            committed = with_retry(lambda: self._transaction(
                lambda con: _commit.body(con, table, step_row, staged_file, evolve=evolve)))
        except BaseException:
            _commit.discard(staged_file)
            self._committed_schemas.clear()  # match every column again from now on
            raise
        self._committed_schemas.add(table.schema)
        if not committed:
            _commit.discard(staged_file)
        return committed

    def _transaction(self, body: Any) -> Any:
        con = self._con
        con.execute("BEGIN")
        try:
            result = body(con)
            con.execute("COMMIT")
            return result
        except BaseException:
            rollback(con)
            raise
        finally:
            for name in ("_gfcr_batch", "_gfcr_step", "_gfcr_run"):
                con.unregister(name)


def _build_folder_catalog(catalog: Catalog) -> None:
    """A new store folder's catalog, with its tables, built aside and linked into place
    whole (store._catalog); a catalog another process published first is kept."""
    target = Path(catalog.target)
    temp = _catalog.temp_path(target)
    build = replace(catalog, target=str(temp), override_data_path=False, wal=False,
                    data_path=_catalog.RELATIVE_DATA_PATH if catalog.override_data_path
                    else catalog.data_path)
    try:
        con = connect(build, read_only=False)
        try:
            _tables.create_tables(con)
        finally:
            con.close()
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    _catalog.publish(temp, target)


def _run_exists(con: duckdb.DuckDBPyConnection, run_id: str) -> bool:
    return bool(scalar(con, "SELECT count(*) FROM lake.runs WHERE run_id = ?", [run_id]))


def _now() -> datetime:
    return datetime.now(timezone.utc)
