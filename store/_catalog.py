"""Checks of a store folder's catalog file, and its creation in one atomic step.

An existing ``catalog.sqlite`` is never replaced: DuckLake would attach an empty or
damaged file as a new, empty lake and the store's rollouts would silently vanish (their
Parquet files orphaned). So before DuckLake sees it, the file is checked: it must be
non-empty, a SQLite database (its 16-byte magic header), as long as its header says
(a truncated copy is not), and hold DuckLake's ``ducklake_metadata`` table. Anything
else is refused with the path and what was found there.

A new store's catalog is built in a temporary file beside it and linked into place
when whole, so no process ever sees a half-made ``catalog.sqlite`` (two runs starting
together on a fresh root both open the one that won). The catalog stores its data path
as ``data/``, relative to the store folder; gfcr attaches it with the folder's own
``data/`` (``OVERRIDE_DATA_PATH``), so a copied or moved store reads its own files.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import duckdb

SQLITE_MAGIC = b"SQLite format 3\x00"
RELATIVE_DATA_PATH = "data/"
"""The data path a new store's catalog records: its ``data/`` folder."""
TEMP_MARK = ".tmp-"
"""Infix of a catalog being built (``catalog.sqlite.tmp-<pid>-<hex>``)."""


def problem(path: Path) -> str | None:
    """None if ``path`` looks like a whole DuckLake catalog, else what is wrong with it.

    A catalog this process already has open (another store object on it, a writer on
    another thread) is not read again: closing any descriptor of a file drops every POSIX
    lock the process holds on it, so a plain read here would release SQLite's locks
    under a live writer and let another process write the catalog at the same time. It
    was checked when it was first opened."""
    if held_here(path):
        return None
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(100)
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    if size == 0:
        return "is empty (0 bytes)"
    if not head.startswith(SQLITE_MAGIC):
        return f"is not a SQLite database (it starts with {head[:16]!r})"
    truncated = _truncated(path, head, size)
    if truncated:
        return truncated
    return _foreign(path)


def held_here(path: Path) -> bool:
    """Whether this process has ``path`` open (Linux: ``/proc/self/fd``; elsewhere,
    False)."""
    fds = Path("/proc/self/fd")
    if not fds.is_dir():
        return False
    try:
        target = path.resolve()
    except OSError:
        return False
    for fd in fds.iterdir():
        try:
            if Path(os.readlink(fd)) == target:
                return True
        except OSError:  # closed while listing
            continue
    return False


def _truncated(path: Path, head: bytes, size: int) -> str | None:
    if len(head) < 100:
        return f"is truncated ({size} bytes, shorter than a SQLite header)"
    page = int.from_bytes(head[16:18], "big")
    page = 65536 if page == 1 else page
    pages = int.from_bytes(head[28:32], "big")
    header_valid = head[24:28] == head[92:96] and pages > 0
    writer_active = Path(f"{path}-wal").exists()  # the header trails a live WAL
    if header_valid and not writer_active and size < pages * page:
        return f"is truncated ({size} bytes; its header says {pages} pages of {page} bytes)"
    if size % page:
        return f"is truncated ({size} bytes, not a whole number of {page}-byte pages)"
    return None


def _foreign(path: Path) -> str | None:
    """Through DuckDB's SQLite extension, the SQLite library DuckLake itself uses: a
    second SQLite library in one process (Python's ``sqlite3``) releases the other's file
    locks when it closes the file, which corrupts a catalog another thread is writing."""
    from ._duck import extension_path, quote_literal

    con = duckdb.connect(config={"autoinstall_known_extensions": False,
                                 "autoload_known_extensions": False})
    try:
        con.execute(f"LOAD '{extension_path('sqlite')}'")
        con.execute(f"ATTACH {quote_literal(str(path))} AS probe (TYPE sqlite, READ_ONLY)")
        names = [r[0] for r in con.execute(
            "SELECT table_name FROM duckdb_tables() WHERE database_name = 'probe'").fetchall()]
    except duckdb.Error as exc:
        text = str(exc)
        if any(word in text for word in ("malformed", "not a database", "corrupt")):
            return f"is damaged ({text.splitlines()[0]})"
        return None  # locked, or unreadable here: DuckLake says why
    finally:
        con.close()
    if "ducklake_metadata" in names:
        return None
    shown = ", ".join(sorted(names)[:8]) or "no tables"
    return f"is a SQLite database but not a DuckLake catalog (it holds: {shown})"


def temp_path(catalog: Path) -> Path:
    """A fresh name beside ``catalog`` to build a new catalog in."""
    return catalog.with_name(f"{catalog.name}{TEMP_MARK}{os.getpid()}-{secrets.token_hex(4)}")


def publish(temp: Path, catalog: Path) -> bool:
    """Link the whole catalog ``temp`` into place as ``catalog`` unless one exists already
    (another process won the race: its catalog is used); ``temp`` is removed. Returns
    whether this one was published."""
    try:
        os.link(temp, catalog)
        return True
    except FileExistsError:
        return False
    except OSError:  # no hard links on this file system: a rename, unless one appeared
        if catalog.exists():
            return False
        os.replace(temp, catalog)
        return True
    finally:
        for leftover in (temp, Path(f"{temp}-journal"), Path(f"{temp}-wal"), Path(f"{temp}-shm")):
            leftover.unlink(missing_ok=True)
