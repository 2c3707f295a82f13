"""Turn the errors a user can cause or fix into one paragraph for ``gfcr run``.

Beyond pipeline and resume errors (gfcr.pipeline, gfcr.resume), a run can fail because
of where it writes: a read-only store or root, a full disk, a folder it may not write.
Those arrive from deep inside DuckDB, SQLite (MLflow) or the file system, often wrapped,
as hundreds of lines of traceback that never name the path. ``explain`` walks the
exception chain for them and names the path: the file the OS error gives, else the
store or MLflow database the failing library writes, else the run root.
"""

from __future__ import annotations

import errno
from pathlib import Path

_DISK = {errno.ENOSPC: "the disk is full", errno.EDQUOT: "the disk quota is exceeded",
         errno.EROFS: "the file system is read-only", errno.EACCES: "permission denied",
         errno.EPERM: "permission denied"}
_MARKERS = {"no space left": "the disk is full", "database or disk is full": "the disk is full",
            "read-only file system": "the file system is read-only",
            "readonly database": "the database is read-only",
            "permission denied": "permission denied", "disk quota": "the disk quota is exceeded"}


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in seen:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


def explain(exc: BaseException, root: Path) -> str | None:
    """One paragraph for a storage error in ``exc``'s chain, or None if there is none."""
    for link in _chain(exc):
        if isinstance(link, OSError) and link.errno in _DISK:
            where = link.filename or _owner(link, root)
            return _paragraph(_DISK[link.errno], str(where), root)
        text = str(link).lower()
        for marker, why in _MARKERS.items():
            if marker in text:
                return _paragraph(why, _owner(link, root), root)
    return None


def _owner(exc: BaseException, root: Path) -> str:
    """The file the library that raised ``exc`` writes under ``root``."""
    module = type(exc).__module__
    if module.startswith(("sqlalchemy", "mlflow", "alembic", "sqlite3")):
        return str(root / "mlflow.db")
    if module.startswith("duckdb"):
        return str(root / "store")
    return str(root)


def _paragraph(why: str, where: str, root: Path) -> str:
    return (f"cannot write {where!r}: {why}. The run stopped; what the store had committed "
            f"before is kept. Free space or make {str(root)!r} writable (or pass another "
            "--root), then continue with `gfcr run --resume RUN_ID`")
