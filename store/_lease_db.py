"""The lease database of :mod:`store.lease`: a store folder's SQLite file, or PostgreSQL.

Its own module so that the lease renewer's process (:mod:`store._renewer`) opens it
without importing the store.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any, Protocol

from ._duck import extension_path, quote_literal


class Backend(Protocol):
    now: str

    def execute(self, sql: str) -> None: ...

    def query(self, sql: str) -> list[tuple[Any, ...]]: ...

    def close(self) -> None: ...


class Sqlite:
    now = "((julianday('now') - 2440587.5) * 86400.0)"

    def __init__(self, path: str, read_only: bool) -> None:
        uri = Path(path).resolve().as_uri() + ("?mode=ro" if read_only else "")
        self.con = sqlite3.connect(uri, uri=True, timeout=30, isolation_level=None,
                                   check_same_thread=False)

    def execute(self, sql: str) -> None:
        self.con.execute(sql)

    def query(self, sql: str) -> list[tuple[Any, ...]]:
        return self.con.execute(sql).fetchall()

    def close(self) -> None:
        self.con.close()


class Postgres:
    """Statements run in PostgreSQL itself (``postgres_execute``/``postgres_query``), so
    each is one atomic statement there, not a DuckDB scan and rewrite."""

    now = "extract(epoch from clock_timestamp())::double precision"

    def __init__(self, conninfo: str, read_only: bool) -> None:
        import duckdb

        self.con = duckdb.connect(config={"autoinstall_known_extensions": False,
                                          "autoload_known_extensions": False})
        self.con.execute(f"LOAD '{extension_path('postgres')}'")
        mode = ", READ_ONLY" if read_only else ""
        self.con.execute(f"ATTACH {quote_literal(conninfo)} AS pg (TYPE postgres{mode})")

    def execute(self, sql: str) -> None:
        self.con.execute(f"CALL postgres_execute('pg', {quote_literal(sql)})")

    def query(self, sql: str) -> list[tuple[Any, ...]]:
        return self.con.execute(f"SELECT * FROM postgres_query('pg', {quote_literal(sql)})").fetchall()

    def close(self) -> None:
        self.con.close()


def open_db(kind: str, target: str, *, read_only: bool = False) -> Backend:
    """The lease database: ``kind`` sqlite (``target`` its file) or postgres (``target``
    a connection string)."""
    return Sqlite(target, read_only) if kind == "sqlite" else Postgres(target, read_only)
