"""The DuckLake store as a gfcr store backend (gfcr.core.storage.StoreBackend), registered
under the ``gfcr.store`` entry point ``lake``: how the runtime opens this package's
stores without importing it."""

from __future__ import annotations

import os
from collections.abc import Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from gfcr.core.storage import StoreBackend

from ._guard import ReadOnlyError
from .browse import LakeBrowseReads
from ._location import StoreError, resolve
from .history import LakeHistory
from .lake import RolloutStore
from .lease import LeaseHeld, LeaseLost, LeaseRow, RunLease, hold, leases
from .maintenance import CompactResult, compact, export
from .reads import LakeRunReads
from .script import statements


class LakeBackend:
    """Opens :class:`RolloutStore` s and builds their :class:`LakeHistory` views."""

    errors: tuple[type[Exception], ...] = (StoreError, ReadOnlyError, LeaseHeld, LeaseLost)

    def open(self, uri: str | os.PathLike[str], *, read_only: bool = False,
             create: bool = True) -> RolloutStore:
        return RolloutStore.open(uri, read_only=read_only, create=create)

    def history(self, store: RolloutStore, run_id: str | None, *, as_of_step: int | None = None,
                as_of_snapshot: int | None = None) -> LakeHistory:
        if as_of_step is not None:
            return LakeHistory(store, run_id, as_of_step=as_of_step)
        return LakeHistory(store, run_id, as_of_snapshot=as_of_snapshot)

    def export(self, store: RolloutStore, dest: Path, *, format: str, table: str,
               match: Mapping[str, Any] | None) -> Path:
        return export(store, dest, format=format, table=table,  # type: ignore[arg-type]
                      match=match)

    def reads(self, store: RolloutStore) -> LakeRunReads:
        return LakeRunReads(store)

    def browse(self, store: RolloutStore) -> LakeBrowseReads:
        return LakeBrowseReads(store)

    def compact(self, store: RolloutStore) -> CompactResult:
        return compact(store)

    def hold(self, store: RolloutStore, run_id: str) -> AbstractContextManager[RunLease]:
        return hold(store, run_id)

    def leases(self, uri: str | os.PathLike[str]) -> dict[str, LeaseRow]:
        try:
            catalog, _ = resolve(uri, data_path=None, read_only=True, create=False)
        except (StoreError, OSError):
            return {}
        return leases(catalog)

    def duckdb_script(self, uri: str | os.PathLike[str]) -> str:
        return statements(uri)


BACKEND: StoreBackend = LakeBackend()
"""What the ``gfcr.store`` entry point ``lake`` names (mypy checks it fits the protocol)."""
