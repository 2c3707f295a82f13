"""What every page of ``gfcr ui`` reads through: the store, opened read-only on first
use, and the errors a page turns into a message instead of a traceback."""

from __future__ import annotations

import os
import threading

from gfcr.core.browse import BrowseReads
from gfcr.core.storage import RunReads, RunStore, backend
from gfcr.report.rows import Row


class UiError(Exception):
    """A page that cannot be shown: ``status`` (404, 400, 503) and what was wrong."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


class PageContext:
    """The store at ``uri``, read-only (never created, never migrated: an old store is
    read as it is), opened on first use and reopened after a failure; each read holds
    the store's own lock, so pages and the live feed never interleave statements."""

    def __init__(self, uri: str | os.PathLike[str]):
        self.uri = os.fspath(uri)
        self._store: RunStore | None = None
        self._lock = threading.Lock()
        self.cache: dict[tuple[object, ...], object] = {}
        """What a page computed of a run, by the run's marker (its committed steps and
        status) at the time: a committed step never changes, so a cached figure stands
        until the run moves."""
        self.serial = threading.Lock()
        """Held by a page while it reads: pages take turns (each is short), so no two
        threads interleave a page's statements or import what a page needs at once."""

    def store(self) -> RunStore:
        with self._lock:
            if self._store is None:
                lake = backend()
                try:
                    self._store = lake.open(self.uri, read_only=True, create=False)
                except lake.errors + (FileNotFoundError, ValueError) as e:
                    raise UiError(503, f"cannot read the store at {self.uri!r}: {e}") from e
                except Exception as e:  # noqa: BLE001 - e.g. a catalog DuckDB cannot bind
                    raise UiError(503, f"cannot read the store at {self.uri!r}: "
                                       f"{type(e).__name__}: {e}") from e
            return self._store

    def reads(self) -> RunReads:
        return backend().reads(self.store())

    def browse(self) -> BrowseReads:
        return backend().browse(self.store())

    def run(self, run_id: str) -> Row:
        """The ``runs`` row of ``run_id``; UiError 404 naming the latest runs otherwise."""
        row = self.reads().run(run_id)
        if row is None:
            latest = self.reads().latest_run_ids(5)
            raise UiError(404, f"no run {run_id!r} in the store at {self.uri!r}; its latest "
                               f"runs: {', '.join(latest) or 'none'}")
        return row

    def close(self) -> None:
        with self._lock:
            if self._store is not None:
                self._store.close()
                self._store = None
