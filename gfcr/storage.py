"""What the runtime needs of a rollout store, as protocols, and how it finds one.

gfcr does not import the ``store`` package: ``store`` depends on gfcr (the rollout
schema), and the runtime reaches it through :class:`StoreBackend`, found by the
``gfcr.store`` entry point the way operator libraries are found through ``gfcr.plugins``
(``store`` ships the one named ``lake``, DuckLake). So the dependency runs one way, and a
test or another backend can stand in for it.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Protocol, Sequence

import pyarrow as pa

from gfcr.loop import Committed


class History(Protocol):
    """A read-only view of a run's stored rows, pinned to one snapshot (the step's)."""

    def prompt_stats(self, prompt_ids: Sequence[str] | None = None) -> pa.Table: ...

    def step_metrics(self, run_id: str | None = None) -> pa.Table: ...


class RunStore(Protocol):
    """An open rollout store, as the runtime and the CLI use it."""

    @property
    def uri(self) -> str: ...

    def sql(self, query: str, params: Any = None) -> pa.Table: ...

    def commit_step(self, run_id: str, step: int, rollouts: pa.Table, *, policy_version: int,
                    metrics: dict[str, float]) -> Committed: ...

    def step_snapshot(self, run_id: str, step: int) -> int | None: ...

    def close(self) -> None: ...

    def __enter__(self) -> Any: ...

    def __exit__(self, *exc: object) -> None: ...


class StoreBackend(Protocol):
    """Opens stores and reads their history; ``errors`` are what its calls raise for bad
    input (a missing store, a read-only one written to), reported without a traceback."""

    errors: tuple[type[Exception], ...]

    def open(self, uri: str | Path, *, read_only: bool = False,
             create: bool = True) -> RunStore: ...

    def history(self, store: Any, run_id: str, *, as_of_step: int | None = None,
                as_of_snapshot: int | None = None) -> History: ...

    def export(self, store: Any, dest: Path, *, format: str, table: str,
               where: str | None) -> Path: ...

    def compact(self, store: Any) -> Any: ...

    def hold(self, store: Any, run_id: str) -> AbstractContextManager[object]:
        """The run's lease, held while the block runs: one owner per run id."""
        ...


_BACKEND: list[StoreBackend] = []


def backend(name: str = "lake") -> StoreBackend:
    """The store backend registered as ``name`` in the ``gfcr.store`` entry-point group."""
    if not _BACKEND:
        found = {ep.name: ep for ep in entry_points(group="gfcr.store")}
        if name not in found:
            raise RuntimeError(f"no rollout store backend {name!r} is installed (entry point "
                               f"group 'gfcr.store'; found: {', '.join(found) or 'none'}); "
                               "reinstall gfcr (pip install -e .)")
        _BACKEND.append(found[name].load())
    return _BACKEND[0]
