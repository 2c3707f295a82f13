"""Store maintenance: export rollouts (Parquet, JSONL) and compact small files.

``export`` streams a table or view through DuckDB's COPY on the store's read-only
connection, so it never holds the whole table in memory and never writes the lake.
``compact`` flushes rows DuckLake inlined into the catalog and merges adjacent small
Parquet files (one per step commit) into larger ones. It expires no snapshot, so time
travel (``History(as_of_step=…)``) still reads exactly what it read before; the replaced
files stay on disk until snapshots are expired, which this module never does.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Mapping
from typing import Any, Literal

import duckdb

from ._duck import all_threads, quote_ident, quote_literal, scalar, with_retry
from ._guard import ReadOnlyError, check_read_only
from ._location import StoreError
from ._match import where_clause
from .lake import RolloutStore
from .views import VIEWS

Format = Literal["parquet", "jsonl", "hf"]
_TABLES = ("rollouts", "steps", "runs", "evaluations", "eval_completions", *VIEWS, "turns")
_COPY_OPTIONS = {"parquet": "FORMAT parquet, COMPRESSION zstd", "jsonl": "FORMAT json"}


@dataclass(frozen=True)
class CompactResult:
    """Data files of ``rollouts`` before and after compaction."""

    files_before: int
    files_after: int


def export(store: RolloutStore, dest: str | os.PathLike[str], *, format: Format = "parquet",
           table: str = "rollouts", match: Mapping[str, Any] | None = None) -> Path:
    """Write ``table`` (a store table or view), its rows filtered by ``match``, to ``dest``.

    ``match`` maps column names to values (``{"kept": True, "step": (3, 7)}``; see
    store._match): typed conditions, never SQL text. The query goes through the read-only
    guard and runs on the sandboxed connection ``gfcr sql`` uses (no file outside the
    store can be read); its rows stream to a DuckDB connection that has nothing attached
    and writes ``dest``. ``format`` is "parquet" (zstd), "jsonl" (one JSON object per line;
    maps become objects, lists arrays) or "hf" (a Hugging Face ``datasets`` dataset saved
    to the folder ``dest``, loadable with ``datasets.load_from_disk``). Returns the path
    written. The parent folder must exist.
    """
    if format == "hf":
        return _export_hf(store, dest, table=table, match=match)
    if format not in _COPY_OPTIONS:
        raise ValueError(f"export format {format!r} is not one of "
                         f"{sorted([*_COPY_OPTIONS, 'hf'])}")
    if table not in _TABLES:
        raise ValueError(f"cannot export {table!r}: the store has {list(_TABLES)}")
    path = Path(dest).expanduser().resolve()
    if not path.parent.is_dir():
        raise FileNotFoundError(f"export folder {str(path.parent)!r} does not exist")
    with store._lock:  # package-internal: one statement at a time per connection
        con = store._query()
        schema = con.execute(f"SELECT * FROM {quote_ident(table)} LIMIT 0").to_arrow_table().schema
        where, params = where_clause(schema, match)
        query, = check_read_only(f"SELECT * FROM {quote_ident(table)}{where}")
        rows = con.execute(query, params).fetch_record_batch()
        writer = duckdb.connect(config={"autoinstall_known_extensions": False,
                                        "autoload_known_extensions": False})
        try:
            writer.register("_gfcr_export", rows)
            writer.execute(f"COPY _gfcr_export TO {quote_literal(str(path))} "
                           f"({_COPY_OPTIONS[format]})")
        finally:
            writer.close()
    return path


def _export_hf(store: RolloutStore, dest: str | os.PathLike[str], *, table: str,
               match: Mapping[str, Any] | None) -> Path:
    """A datasets dataset saved to disk. ``datasets`` has no map type, so map columns
    (``rewards``) become lists of {key, value} structs."""
    import tempfile

    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(dest).expanduser().resolve()
    with tempfile.TemporaryDirectory() as tmp:
        rows = pq.read_table(export(store, Path(tmp) / "rows.parquet", table=table, match=match))
        for i, field in enumerate(rows.schema):
            if pa.types.is_map(field.type):
                entries = pa.list_(pa.struct([("key", field.type.key_type),
                                              ("value", field.type.item_type)]))
                rows = rows.set_column(i, field.name, rows.column(i).cast(entries))
        datasets.Dataset(rows).save_to_disk(str(path))
    return path


def compact(store: RolloutStore) -> CompactResult:
    """Flush inlined rows to Parquet and merge small adjacent files; keeps time travel.
    Refused (StoreError naming them) when the catalog lists a data or delete file outside
    the store's data path: a catalog that points elsewhere (copied, edited, or with files
    added by ``ducklake_add_data_files``) would have compaction read those files into the
    store."""
    if store.read_only:
        raise ReadOnlyError(f"store {store.uri!r} is open read-only; compact needs read_only=False")
    outside = files_outside(store)
    if outside:
        shown = ", ".join(repr(p) for p in outside[:3])
        raise StoreError(
            f"store {store.uri!r} lists {len(outside)} data file(s) outside its data path "
            f"{store.catalog.data_path!r} ({shown}{', ...' if len(outside) > 3 else ''}); "
            "compaction would read them into the store, so it is refused. Remove those "
            "files from the catalog, or move them into the data path")
    before = _data_files(store)
    con = store._con  # the writer connection; compaction is a write
    with store._lock, all_threads(con):
        with_retry(lambda: con.execute("CALL ducklake_flush_inlined_data('lake')"))
        with_retry(lambda: con.execute("CALL ducklake_merge_adjacent_files('lake')"))
    return CompactResult(before, _data_files(store))


def files_outside(store: RolloutStore) -> list[str]:
    """The data and delete files of the store's tables that resolve (``..`` and symbolic
    links followed) outside its data path."""
    con, root = store.connection(), store.catalog.data_path
    local = "://" not in root
    base = os.path.realpath(root) if local else root
    outside: list[str] = []
    tables = con.execute("SELECT table_name FROM duckdb_tables() WHERE database_name = 'lake'")
    for (table,) in tables.fetchall():
        for row in con.execute("SELECT data_file, delete_file FROM ducklake_list_files("
                               "'lake', ?)", [table]).fetchall():
            for path in filter(None, row):
                real = os.path.realpath(path) if local else path
                inside = (os.path.commonpath([base, real]) == base if local
                          else real.startswith(base))
                if not inside:
                    outside.append(str(path))
    return outside


def _data_files(store: RolloutStore) -> int:
    return int(str(scalar(store.connection(),
                          "SELECT count(*) FROM ducklake_list_files('lake', 'rollouts')")))
