"""Turn the errors a user can cause or fix into one paragraph for ``gfcr run``.

Beyond pipeline and resume errors (gfcr.core.pipeline, gfcr.checkpoints.resume), a run can fail because
of where it writes: a read-only store or root, a full disk, a folder it may not write.
Those arrive from deep inside DuckDB, SQLite (the store's catalog and leases, MLflow) or
the file system, often wrapped, as hundreds of lines of traceback that never name the
path. ``explain`` walks the exception chain for them and names what failed: the file the
OS error gives, else what the code that raised writes, found from the modules in its
traceback (a SQLite error in ``store.lease`` is the store's lease database, one in
MLflow's SQLAlchemy is the MLflow database), else the run root. The earliest failure of
the chain is named: a later one (a lease that could not be released while the run
stopped) is its consequence. MLflow is named only when the run tracks in MLflow.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path
from types import TracebackType

_DISK = {errno.ENOSPC: "the disk is full", errno.EDQUOT: "the disk quota is exceeded",
         errno.EROFS: "the file system is read-only", errno.EACCES: "permission denied",
         errno.EPERM: "permission denied"}
_MARKERS = {"no space left": "the disk is full", "database or disk is full": "the disk is full",
            "read-only file system": "the file system is read-only",
            "readonly database": "the database is read-only",
            "permission denied": "permission denied", "disk quota": "the disk quota is exceeded"}
_OWNERS = (("store.lease", "lease"), ("store", "store"), ("duckdb", "store"),
           ("_duckdb", "store"), ("mlflow", "mlflow"), ("sqlalchemy", "mlflow"),
           ("alembic", "mlflow"), ("prefect", "prefect"), ("gfcr.checkpoints.checkpoint", "checkpoints"),
           ("torch", "checkpoints"), ("gfcr.transport.stash", "staging"), ("gfcr.report", "report"))
"""Module name prefixes of the code that raised, and what it was writing."""
_SHORT_WRITE = ("unexpected pos", "file write failed")
"""What torch's checkpoint writer raises on a short write, with no errno (a full disk)."""


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in seen:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


def explain(exc: BaseException, root: Path, *, store: str | None = None,
            tracking: bool = True) -> str | None:
    """One paragraph for a storage error in ``exc``'s chain, or None if there is none.
    ``store``: the run's store (None: ROOT/store); ``tracking``: whether it logs to MLflow."""
    for link in reversed(_chain(exc)):  # the earliest failure first
        if isinstance(link, OSError) and link.errno in _DISK:
            where = link.filename or _owner(link, root, store, tracking)
            return _paragraph(_DISK[link.errno], str(where), root)
        text = str(link).lower()
        for marker, why in _MARKERS.items():
            if marker in text:
                return _paragraph(why, _owner(link, root, store, tracking), root)
        if any(marker in text for marker in _SHORT_WRITE):
            return _paragraph(_short_write(root), _owner(link, root, store, tracking), root)
    return None


def _short_write(root: Path) -> str:
    """Why a write came up short: a full disk where the root's file system has next to
    nothing left (under 1 MiB, or under 0.5% of it), else the plain fact."""
    try:
        usage = shutil.disk_usage(root)
    except OSError:
        return "a write was cut short"
    full = usage.free < max(1 << 20, usage.total // 200)
    return "the disk is full" if full else "a write was cut short"


def _owner(exc: BaseException, root: Path, store: str | None, tracking: bool) -> str:
    """What the code that raised ``exc`` writes: the innermost frame of its traceback
    (or its type's module) that belongs to a known writer."""
    store_path = store or str(root / "store")
    places = {"lease": _lease_file(store_path), "store": store_path,
              "mlflow": str(root / "mlflow.db") if tracking else None,
              "prefect": _prefect_home(), "checkpoints": str(root / "runs"),
              "staging": str(root / "staging"), "report": str(root / "runs")}
    for module in [*_modules(exc.__traceback__), type(exc).__module__]:
        for prefix, what in _OWNERS:
            if module == prefix or module.startswith(prefix + "."):
                if places[what] is not None:
                    return str(places[what])
    return f"a file under {str(root)!r}"


def _modules(tb: TracebackType | None) -> list[str]:
    """Module names of a traceback's frames, innermost first."""
    names: list[str] = []
    while tb is not None:
        names.append(str(tb.tb_frame.f_globals.get("__name__", "")))
        tb = tb.tb_next
    return names[::-1]


def _lease_file(store: str) -> str:
    if "://" in store:
        return f"the lease table of {store}"
    return str(Path(store) / "leases.sqlite")


def _prefect_home() -> str:
    return f"Prefect's database under {os.environ.get('PREFECT_HOME', '~/.prefect')}"


def _paragraph(why: str, where: str, root: Path) -> str:
    return (f"cannot write {where!r}: {why}. The run stopped; what the store had committed "
            f"before is kept. Free space or make {str(root)!r} writable (or pass another "
            "--root), then continue with `gfcr run --resume RUN_ID`")
