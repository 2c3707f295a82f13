"""DuckDB connections to a DuckLake catalog, without network access.

DuckDB downloads extensions on first use by default; here that fails. The
``duckdb-extension-*`` packages ship the binaries for one exact DuckDB version, so this
module loads them from the package folders. DuckDB derives an extension's entry symbol
from its file name, and the sqlite and postgres extensions are packaged under names that
differ from the ones DuckDB expects (``sqlite_scanner``, ``postgres_scanner``): they are
linked under those names into a per-user cache directory, atomically so that concurrent
processes never see a half-made link.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import duckdb

T = TypeVar("T")

_ALIASES = {"ducklake": "ducklake", "sqlite": "sqlite_scanner", "postgres": "postgres_scanner"}
WRITER_THREADS = 1
"""DuckDB worker threads of a read-write connection. Its work is step commits: catalog
round trips and a few small appends (a large step's Parquet file is written by pyarrow),
where DuckDB's thread pool spent more CPU than it saved: a default step's commit took
about 100 ms of CPU with 2 threads and 50-70 ms with one, at the same wall time
(BENCHMARKS.md, "Engine"). Compaction, which rewrites data, runs with all threads
(``all_threads``)."""

_RETRY_MARKERS = ("conflict", "database is locked", "busy", "primary key", "unique constraint",
                  "could not serialize", "duplicate key")


@dataclass(frozen=True)
class Catalog:
    """Where a lake lives: the DuckLake catalog and the folder its Parquet files go to."""

    kind: str            # "sqlite" | "postgres"
    target: str          # sqlite file path or libpq connection string
    data_path: str       # folder (with trailing slash) for Parquet data
    override_data_path: bool = False
    """Attach with ``data_path`` whatever the catalog recorded: a store folder's own
    ``data/``, so a copied or moved store reads its own files (store._catalog)."""
    wal: bool = True
    """A SQLite catalog opened read-write runs in WAL mode (not while it is built)."""

    @property
    def attach_uri(self) -> str:
        return f"ducklake:{self.kind}:{self.target}"


def scalar(con: duckdb.DuckDBPyConnection, sql: str, params: list[object] | None = None
           ) -> object:
    """The first column of the one row ``sql`` returns (an aggregate, a table function)."""
    row = con.execute(sql, params or []).fetchone()
    if row is None:
        raise RuntimeError(f"the store's query returned no row: {sql}")
    return row[0]


def extension_path(name: str) -> Path:
    """Path of the loadable file for extension ``name`` ("ducklake", "sqlite", "postgres")."""
    module = __import__(f"duckdb_extension_{name}")
    source = Path(str(module.__file__)).parent / "extensions" / f"v{duckdb.__version__}" / f"{name}.duckdb_extension"
    if not source.is_file():
        raise FileNotFoundError(f"extension file {str(source)!r} is missing; "
                                f"duckdb-extension-{name} must match duckdb=={duckdb.__version__}")
    alias = _ALIASES[name]
    if alias == name:
        return source
    return _linked(source, f"{alias}.duckdb_extension")


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    for root in (Path(base) / "gfcr", Path(tempfile.gettempdir()) / f"gfcr-{os.getuid()}"):
        folder = root / "duckdb-extensions" / f"v{duckdb.__version__}"
        try:
            folder.mkdir(parents=True, exist_ok=True)
            return folder
        except OSError:
            continue
    raise OSError("no writable cache directory for DuckDB extensions")


def _linked(source: Path, name: str) -> Path:
    """A link (or copy) of ``source`` named ``name`` in the cache, made atomically."""
    target = _cache_dir() / name
    if target.exists() and os.path.realpath(target) == str(source.resolve()):
        return target
    tmp = target.with_name(f".{name}.{os.getpid()}.{random.getrandbits(32):x}")
    try:
        os.symlink(source, tmp)
    except OSError:
        shutil.copyfile(source, tmp)
    os.replace(tmp, target)
    return target


def connect(catalog: Catalog, *, read_only: bool, alias: str = "lake",
            sandbox: bool = False) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection with the lake attached as ``alias``.

    Read-only connections attach the catalog read-only, so they never take a write lock
    and never block a writer in another process; the lake is in use, so queries name its
    tables without a prefix. A read-write connection names them with it (``lake.steps``)
    and keeps DuckDB's in-memory database in use: registering an Arrow table (each step
    commit does) resolves the name against the database in use, which for a DuckLake is a
    catalog round trip (about 10 ms a table, against under 1 ms).

    ``sandbox`` (read-only only; the connection ``gfcr sql`` runs on): once the lake is
    attached, files outside the store's folder and data path cannot be read or written
    (``allowed_directories`` with ``enable_external_access = false``: no
    ``read_text('/etc/shadow')``, no network, no extension loading), and
    ``lock_configuration`` keeps a query from changing that.
    """
    con = duckdb.connect(config={"autoinstall_known_extensions": False,
                                 "autoload_known_extensions": False})
    try:
        con.execute(f"LOAD '{extension_path('ducklake')}'")
        con.execute(f"LOAD '{extension_path(catalog.kind)}'")
        con.execute("SET TimeZone = 'UTC'")
        if not read_only:
            con.execute(f"SET threads = {WRITER_THREADS}")
        con.execute(f"ATTACH {quote_literal(catalog.attach_uri)} AS {alias} ({_attach_options(catalog, read_only)})")
        if read_only:
            con.execute(f"USE {alias}")
        if sandbox:
            _lock_down(con, catalog)
    except BaseException:
        con.close()
        raise
    return con


def _lock_down(con: duckdb.DuckDBPyConnection, catalog: Catalog) -> None:
    folders = [catalog.data_path] if "://" not in catalog.data_path else []
    if catalog.kind == "sqlite":
        folders.append(str(Path(catalog.target).parent).rstrip("/") + "/")
    listed = ", ".join(quote_literal(f) for f in folders)
    con.execute(f"SET allowed_directories = [{listed}]")
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")


@contextmanager
def all_threads(con: duckdb.DuckDBPyConnection) -> Iterator[None]:
    """DuckDB's default thread count (one per core) on a writer connection while the
    block runs, WRITER_THREADS again after it."""
    con.execute("RESET threads")
    try:
        yield
    finally:
        con.execute(f"SET threads = {WRITER_THREADS}")


def _attach_options(catalog: Catalog, read_only: bool) -> str:
    options = ["READ_ONLY"] if read_only else []
    if not read_only or catalog.override_data_path:
        options.append(f"DATA_PATH {quote_literal(catalog.data_path)}")
    if catalog.override_data_path:
        options.append("OVERRIDE_DATA_PATH true")
    if not read_only and catalog.kind == "sqlite":
        options += ["META_JOURNAL_MODE 'WAL'"] if catalog.wal else []
        options += ["META_BUSY_TIMEOUT 10000"]
    return ", ".join(options)


def quote_literal(value: str) -> str:
    """A SQL string literal."""
    return "'" + value.replace("'", "''") + "'"


def quote_ident(name: str) -> str:
    """A SQL identifier, quoted."""
    return '"' + name.replace('"', '""') + '"'


def is_retryable(exc: BaseException) -> bool:
    """Whether ``exc`` is a catalog write conflict that a fresh attempt may get past."""
    if not isinstance(exc, duckdb.Error):
        return False
    text = str(exc).lower()
    return any(marker in text for marker in _RETRY_MARKERS)


def with_retry(fn: Callable[[], T], *, attempts: int = 25, base_s: float = 0.02, cap_s: float = 1.0) -> T:
    """Run ``fn``; on a catalog conflict wait with jittered exponential backoff and rerun.

    SQLite answers a read-to-write upgrade that lost a race with "database is locked" at
    once (its busy handler is not called then), so several writers need many cheap
    retries rather than a long busy timeout; the wait doubles up to ``cap_s``.
    """
    for attempt in range(attempts):
        try:
            return fn()
        except duckdb.Error as exc:
            if attempt == attempts - 1 or not is_retryable(exc):
                raise
            time.sleep(min(cap_s, base_s * (2 ** attempt)) * (0.5 + random.random()))
    raise AssertionError("unreachable")


def rollback(con: duckdb.DuckDBPyConnection) -> None:
    """End the open transaction, if any (a failed COMMIT has already ended it)."""
    try:
        con.execute("ROLLBACK")
    except duckdb.TransactionException:
        pass
