"""Turn a store URI into a DuckLake catalog location, refusing what is not a store.

A store is a folder holding ``catalog.sqlite`` (the DuckLake catalog) and ``data/`` (the
Parquet files) — the default — or a PostgreSQL database holding the catalog plus a data
path shared by every host that writes.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import parse_qsl, unquote, urlsplit

from . import _catalog
from ._duck import Catalog

CATALOG_FILE = "catalog.sqlite"
DATA_DIR = "data"
_NEW_STORE_ENTRIES = {DATA_DIR, f"{CATALOG_FILE}-wal", f"{CATALOG_FILE}-shm", f"{CATALOG_FILE}-journal",
                      "leases.sqlite", "leases.sqlite-journal", "leases.sqlite-wal", "leases.sqlite-shm"}


class StoreError(RuntimeError):
    """A store cannot be opened or used as asked; the message names the path and why."""


def resolve(uri: str | os.PathLike[str], *, data_path: str | os.PathLike[str] | None,
            read_only: bool, create: bool) -> tuple[Catalog, bool]:
    """The catalog location of ``uri`` and whether the store is new (to be created)."""
    text = os.fspath(uri)
    if text.startswith(("postgres://", "postgresql://")):
        text, data_path = _data_path_param(text, data_path)
        return _postgres(text, data_path, read_only, create), False
    if text.startswith("file://"):
        text = unquote(urlsplit(text).path)
    elif "://" in text:
        raise StoreError(f"store URI {text!r} has an unsupported scheme; "
                         "use a folder path or a postgres:// DSN")
    return _folder(Path(text).expanduser(), data_path, read_only, create)


def _folder(root: Path, data_path: str | os.PathLike[str] | None,
            read_only: bool, create: bool) -> tuple[Catalog, bool]:
    catalog = root / CATALOG_FILE
    if root.exists() and not root.is_dir():
        raise StoreError(f"store path {str(root)!r} is a file, not a store folder")
    new = not catalog.exists()
    if not new:
        _check_catalog(root, catalog)
    # A store being created by another process may show its data/ folder first.
    if new and root.exists() and any(not _new_store_entry(p.name) for p in root.iterdir()):
        raise StoreError(f"{str(root)!r} exists but is not a gfcr store: it has no {CATALOG_FILE!r} "
                         "and is not empty")
    if new and data_path is None and any((root / DATA_DIR).rglob("*.parquet")):
        raise StoreError(f"store {str(root)!r} has Parquet files under {DATA_DIR}/ but no "
                         f"{CATALOG_FILE!r}: its catalog was lost; gfcr will not start a new "
                         "store over its data. Restore the catalog, or move the folder away")
    if new and (read_only or not create):
        why = "read-only open" if read_only else "create=False"
        raise StoreError(f"no store at {str(root)!r} ({CATALOG_FILE!r} missing) and {why} does not create one")
    data = Path(data_path) if data_path is not None else root / DATA_DIR
    if new:
        data.mkdir(parents=True, exist_ok=True)
    return Catalog("sqlite", str(catalog.resolve()), _folder_uri(data),
                   override_data_path=data_path is None), new


def _new_store_entry(name: str) -> bool:
    return name in _NEW_STORE_ENTRIES or name.startswith(CATALOG_FILE + _catalog.TEMP_MARK)


def _check_catalog(root: Path, catalog: Path) -> None:
    what = _catalog.problem(catalog)
    if what is not None:
        raise StoreError(f"store catalog {str(catalog)!r} {what}; gfcr will not create a new "
                         f"store over it, which would hide the store's data. Restore it from a "
                         f"backup, or move {str(root)!r} away to start a new store there")


def _postgres(dsn: str, data_path: str | os.PathLike[str] | None,
              read_only: bool, create: bool) -> Catalog:
    if data_path is None:
        raise StoreError(f"store {_redact(dsn)!r} keeps its catalog in PostgreSQL and needs "
                         "data_path= (the folder or object-store prefix for Parquet files)")
    data = os.fspath(data_path)
    if "://" not in data:
        folder = Path(data).expanduser()
        if not folder.is_dir() and (read_only or not create):
            raise StoreError(f"data path {str(folder)!r} of store {_redact(dsn)!r} does not exist")
        folder.mkdir(parents=True, exist_ok=True)
        data = _folder_uri(folder)
    return Catalog("postgres", libpq_conninfo(dsn), data)


def _data_path_param(dsn: str, data_path: str | os.PathLike[str] | None
                     ) -> tuple[str, str | os.PathLike[str] | None]:
    """A DSN may carry its store's data path as ``?data_path=...`` (one string names the
    whole store, e.g. in ``--store`` or a deployment): taken out, unless ``data_path``
    is given too."""
    parts = urlsplit(dsn)
    query = parse_qsl(parts.query)
    found = [v for k, v in query if k == "data_path"]
    if not found:
        return dsn, data_path
    rest = "&".join(f"{k}={v}" for k, v in query if k != "data_path")
    return parts._replace(query=rest).geturl(), data_path if data_path is not None else found[-1]


def libpq_conninfo(dsn: str) -> str:
    """``postgresql://user:pw@host:port/db?opt=v`` as a libpq ``key=value`` string."""
    parts = urlsplit(dsn)
    fields = {"host": parts.hostname, "port": parts.port, "dbname": unquote(parts.path.lstrip("/")) or None,
              "user": unquote(parts.username) if parts.username else None,
              "password": unquote(parts.password) if parts.password else None}
    fields.update(dict(parse_qsl(parts.query)))
    return " ".join(f"{key}={_conninfo_value(str(value))}" for key, value in fields.items() if value)


def _conninfo_value(value: str) -> str:
    if value and all(c not in value for c in " '\\"):
        return value
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _folder_uri(folder: Path) -> str:
    return str(folder.expanduser().resolve()).rstrip("/") + "/"


def redact(uri: str) -> str:
    """``uri`` with any password replaced by ``***`` (for messages and the runs table)."""
    return _redact(uri) if uri.startswith(("postgres://", "postgresql://")) else uri


def _redact(dsn: str) -> str:
    parts = urlsplit(dsn)
    if parts.password:
        return dsn.replace(f":{parts.password}@", ":***@")
    return dsn
