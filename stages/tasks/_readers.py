"""Rows of a user's dataset file, each with where it came from (``file:line`` or ``file
row N``), for :class:`stages.tasks.files.FileTask`.

Four formats: JSON lines (``.jsonl``/``.json``; read line by line so a bad line is named by
its number), Parquet, CSV (header row; line = row + 2 when no field spans lines) and a
folder written by ``datasets.Dataset.save_to_disk``. Every reader refuses an empty file
and names a missing column with the columns the file has.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Literal

import pyarrow as pa

Format = Literal["auto", "jsonl", "parquet", "csv", "hf_disk"]
_SUFFIXES = {".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet",
             ".pq": "parquet", ".csv": "csv"}


class DataFileError(ValueError):
    """A dataset file cannot be read as a task: names the file, the line or row, and the
    column."""


@dataclass(frozen=True)
class Row:
    """One record and where it is: ``where`` is ``path:line`` (text formats) or ``path
    row N`` (columnar ones), 1-based."""

    where: str
    values: dict[str, Any]


def detect(path: Path, fmt: Format) -> str:
    """The concrete format of ``path``: ``fmt`` unless it is ``auto``, else from the
    suffix, or ``hf_disk`` for a folder."""
    if fmt != "auto":
        return fmt
    if path.is_dir():
        return "hf_disk"
    found = _SUFFIXES.get(path.suffix.lower())
    if found is None:
        raise DataFileError(f"{path}: cannot tell the format from the suffix "
                            f"{path.suffix!r}; set format to one of jsonl, parquet, csv, "
                            "hf_disk")
    return found


def read(path: Path, fmt: Format, needed: tuple[str, ...]) -> list[Row]:
    """Every record of ``path``; DataFileError when it is missing, empty, unreadable or
    lacks a column of ``needed``."""
    if not path.exists():
        raise DataFileError(f"{path}: no such file or folder")
    kind = detect(path, fmt)
    if kind == "jsonl":
        rows = list(_jsonl(path, needed))
    else:
        table = _TABLES[kind](path)
        _has_columns(path, table.column_names, needed)
        rows = list(_table_rows(path, table, line_offset=2 if kind == "csv" else None))
    if not rows:
        raise DataFileError(f"{path}:1: the file holds no records")
    return rows


def _jsonl(path: Path, needed: tuple[str, ...]) -> Iterator[Row]:
    with path.open(encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as err:
                raise DataFileError(f"{path}:{line_no}: not valid JSON ({err.msg} at "
                                    f"column {err.colno})") from None
            if not isinstance(obj, dict):
                raise DataFileError(f"{path}:{line_no}: expected a JSON object, got "
                                    f"{type(obj).__name__}")
            missing = [c for c in needed if c not in obj]
            if missing:
                raise DataFileError(f"{path}:{line_no}: no column {missing[0]!r} (the "
                                    f"record has {', '.join(map(repr, obj)) or 'none'})")
            yield Row(f"{path}:{line_no}", obj)


def _has_columns(path: Path, columns: list[str], needed: tuple[str, ...]) -> None:
    for name in needed:
        if name not in columns:
            raise DataFileError(f"{path}:1: no column {name!r} (the file has "
                                f"{', '.join(map(repr, columns)) or 'none'})")


def _table_rows(path: Path, table: pa.Table, line_offset: int | None) -> Iterator[Row]:
    for i, values in enumerate(table.to_pylist()):
        where = f"{path}:{i + line_offset}" if line_offset is not None else f"{path} row {i + 1}"
        yield Row(where, values)


def _parquet(path: Path) -> pa.Table:
    import pyarrow.parquet as pq

    try:
        return pq.read_table(path)
    except (pa.ArrowException, OSError) as err:
        raise DataFileError(f"{path}: not a readable Parquet file ({err})") from None


def _csv(path: Path) -> pa.Table:
    import pyarrow.csv as pcsv

    if path.stat().st_size == 0:
        raise DataFileError(f"{path}:1: the file holds no records (not even a header)")
    names = _csv_header(path)
    try:  # every column as text: answers such as "007" stay as written
        return pcsv.read_csv(path, parse_options=pcsv.ParseOptions(newlines_in_values=True),
                             convert_options=pcsv.ConvertOptions(
                                 column_types={n: pa.string() for n in names},
                                 strings_can_be_null=False))
    except pa.ArrowInvalid as err:
        raise DataFileError(f"{path}: not a readable CSV file ({err})") from None


def _csv_header(path: Path) -> list[str]:
    import csv

    with path.open(encoding="utf-8", newline="") as f:
        return next(csv.reader(f), [])


def _hf_disk(path: Path) -> pa.Table:
    import datasets

    try:
        found = datasets.load_from_disk(str(path))
    except (FileNotFoundError, ValueError) as err:
        raise DataFileError(f"{path}: not a folder written by datasets' save_to_disk "
                            f"({err})") from None
    if isinstance(found, datasets.DatasetDict):
        raise DataFileError(f"{path}: holds several splits ({', '.join(found)}); point path "
                            f"at one of them (e.g. {str(path / next(iter(found)))!r}) and "
                            "heldout_path at another")
    table: pa.Table = found.with_format("arrow")[:]  # the rows, any selection applied
    return table


_TABLES = {"parquet": _parquet, "csv": _csv, "hf_disk": _hf_disk}
