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
from typing import Literal

from ._duck import all_threads, quote_literal, scalar, with_retry
from ._guard import ReadOnlyError, check_read_only
from .lake import RolloutStore
from .views import VIEWS

Format = Literal["parquet", "jsonl", "hf"]
_TABLES = ("rollouts", "steps", "runs", *VIEWS)
_COPY_OPTIONS = {"parquet": "FORMAT parquet, COMPRESSION zstd", "jsonl": "FORMAT json"}


@dataclass(frozen=True)
class CompactResult:
    """Data files of ``rollouts`` before and after compaction."""

    files_before: int
    files_after: int


def export(store: RolloutStore, dest: str | os.PathLike[str], *, format: Format = "parquet",
           table: str = "rollouts", where: str | None = None) -> Path:
    """Write ``table`` (a store table or view, optionally ``WHERE where``) to file ``dest``.

    ``format`` is "parquet" (zstd), "jsonl" (one JSON object per line; maps become
    objects, lists arrays) or "hf" (a Hugging Face ``datasets`` dataset saved to the folder
    ``dest``, loadable with ``datasets.load_from_disk``). Returns the path written. The
    parent folder must exist.
    """
    if format == "hf":
        return _export_hf(store, dest, table=table, where=where)
    if format not in _COPY_OPTIONS:
        raise ValueError(f"export format {format!r} is not one of "
                         f"{sorted([*_COPY_OPTIONS, 'hf'])}")
    if table not in _TABLES:
        raise ValueError(f"cannot export {table!r}: the store has {list(_TABLES)}")
    query = f"SELECT * FROM {table}" + (f" WHERE {where}" if where else "")
    if len(check_read_only(query)) != 1:
        raise ValueError(f"where clause {where!r} must not contain several statements")
    path = Path(dest).expanduser().resolve()
    if not path.parent.is_dir():
        raise FileNotFoundError(f"export folder {str(path.parent)!r} does not exist")
    with store._lock:  # package-internal: one statement at a time per connection
        store.connection().execute(f"COPY ({query}) TO {quote_literal(str(path))} ({_COPY_OPTIONS[format]})")
    return path


def _export_hf(store: RolloutStore, dest: str | os.PathLike[str], *, table: str,
               where: str | None) -> Path:
    """A datasets dataset saved to disk. ``datasets`` has no map type, so map columns
    (``rewards``) become lists of {key, value} structs."""
    import tempfile

    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(dest).expanduser().resolve()
    with tempfile.TemporaryDirectory() as tmp:
        rows = pq.read_table(export(store, Path(tmp) / "rows.parquet", table=table, where=where))
        for i, field in enumerate(rows.schema):
            if pa.types.is_map(field.type):
                entries = pa.list_(pa.struct([("key", field.type.key_type),
                                              ("value", field.type.item_type)]))
                rows = rows.set_column(i, field.name, rows.column(i).cast(entries))
        datasets.Dataset(rows).save_to_disk(str(path))
    return path


def compact(store: RolloutStore) -> CompactResult:
    """Flush inlined rows to Parquet and merge small adjacent files; keeps time travel."""
    if store.read_only:
        raise ReadOnlyError(f"store {store.uri!r} is open read-only; compact needs read_only=False")
    before = _data_files(store)
    con = store._con  # the writer connection; compaction is a write
    with store._lock, all_threads(con):
        with_retry(lambda: con.execute("CALL ducklake_flush_inlined_data('lake')"))
        with_retry(lambda: con.execute("CALL ducklake_merge_adjacent_files('lake')"))
    return CompactResult(before, _data_files(store))


def _data_files(store: RolloutStore) -> int:
    return int(str(scalar(store.connection(),
                          "SELECT count(*) FROM ducklake_list_files('lake', 'rollouts')")))
