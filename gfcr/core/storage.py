"""What the runtime needs of a rollout store, as protocols, and how it finds one.

gfcr does not import the ``store`` package: ``store`` depends on gfcr (the rollout
schema), and the runtime reaches it through :class:`StoreBackend`, found by the
``gfcr.store`` entry point the way operator libraries are found through ``gfcr.plugins``
(``store`` ships the one named ``lake``, DuckLake). So the dependency runs one way, and a
test or another backend can stand in for it.

Stages see a store only as a :class:`History` (``StepContext.history``: the run's store
as of the step's snapshot; ``StepContext.other_store``: another store, read-only): typed
reads, with no SQL dialect or time-travel syntax of the backend in stage code.
"""

from __future__ import annotations

import os
import threading
from contextlib import AbstractContextManager
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Literal, Mapping, Protocol, Sequence

import pyarrow as pa

from gfcr.core.browse import BrowseReads
from gfcr.core.row_filter import EVERY_ROW, Order, RowFilter


class History(Protocol):
    """A read-only view of a store's rows, pinned to one snapshot (the step's), and
    restricted to one run when ``run_id`` is set. Every read sees that snapshot, so a
    resumed run reads exactly what the original step read. Tables are Arrow; the
    backend documents their schemas (store.history)."""

    @property
    def uri(self) -> str:
        """The store's location, as opened."""
        ...

    @property
    def run_id(self) -> str | None: ...

    @property
    def snapshot(self) -> int | None:
        """The pinned snapshot id (None: the live store)."""
        ...

    def rows(self, filter: RowFilter = EVERY_ROW, *, columns: Sequence[str] | None = None,
             order_by: Order = (), limit: int | None = None) -> pa.Table:
        """The ``rollouts`` rows that meet ``filter``, as of the snapshot: only
        ``columns`` (None: every column the store has, extra ones included), sorted by
        ``order_by`` and at most ``limit`` of them. The store evaluates the filter, the
        projection, the order and the limit where the rows lie (no SQL from the caller);
        an unknown column raises ValueError naming it."""
        ...

    def prompt_stats(self, prompt_ids: Sequence[str] | None = None) -> pa.Table:
        """Per prompt: attempts, successes, Beta posterior and EW pass rate (the
        ``prompt_history`` view); with ``prompt_ids``, one row per id in that order."""
        ...

    def step_metrics(self, run_id: str | None = None) -> pa.Table:
        """The ``steps`` rows (policy version, counts, metrics map) of the run, by step."""
        ...


class HistorySource(Protocol):
    """Opens another store's :class:`History`, read-only (cross-run replay)."""

    def __call__(self, uri: str, *, as_of_snapshot: int | None = None) -> History: ...


class Committed(Protocol):
    """What a commit reports (store.CommitResult is one)."""

    @property
    def message(self) -> str: ...


class RunStore(Protocol):
    """An open rollout store, as the runtime and the CLI use it."""

    @property
    def uri(self) -> str: ...

    def sql(self, query: str, params: list[object] | dict[str, object] | None = None
            ) -> pa.Table: ...

    def commit_step(self, run_id: str, step: int, rollouts: pa.Table, *, policy_version: int,
                    metrics: dict[str, float]) -> Committed: ...

    def step_snapshot(self, run_id: str, step: int) -> int | None: ...

    def last_step(self, run_id: str) -> int | None:
        """The run's newest committed step (None: none yet)."""
        ...

    def interrupt(self) -> None:
        """Stop the statement ``sql`` is running (from another thread: Ctrl-C)."""
        ...

    def close(self) -> None: ...

    def __enter__(self) -> RunStore: ...

    def __exit__(self, *exc: object) -> None: ...


class Lease(Protocol):
    """A run's lease as the store holds it (one owner per run id)."""

    @property
    def taken_at(self) -> float:
        """When its holder took it (seconds since the epoch, the store's clock)."""
        ...

    def stale(self) -> str | None:
        """Why it no longer guards a live run (lapsed, its process gone), or None."""
        ...


class HeldLease(Protocol):
    """A lease this process holds (``StoreBackend.hold``)."""

    def check(self) -> None:
        """Raise unless this process still holds it: a run that lost its lease (another
        process took it over) writes nothing more, its status included."""
        ...


RunView = Literal["report_steps", "drops", "pass_bins", "group_facts", "partial_credit",
                  "repeated_wrong", "score_errors", "prompt_coverage", "turn_figures"]
"""The per-run views a store serves (``store.run_views`` defines them)."""


class RunReads(Protocol):
    """Named, read-only reads of a store's runs, for ``gfcr runs``, the report, the
    doctor, resume and the tracker (``StoreBackend.reads``): the store holds their SQL,
    gfcr none. Values are bound by the store, never spliced into SQL text."""

    def run(self, run_id: str) -> dict[str, Any] | None:
        """The ``runs`` row of ``run_id`` (spec_yaml, spec_hash, status, ...), or None."""
        ...

    def latest_run_ids(self, limit: int) -> list[str]:
        """The ids of the ``limit`` runs started last, newest first."""
        ...

    def runs(self) -> pa.Table:
        """Every run: ``run_id``, ``pipeline``, ``status``, ``started_at``, ``finished_at``,
        ``spec_hash``, ``error`` (null where the store predates it), by start time."""
        ...

    def steps(self, run_id: str, *, after: int | None = None) -> pa.Table:
        """The run's ``steps`` rows (``step``, ``policy_version``, ``n_rollouts``,
        ``n_kept``, ``metrics``, ``committed_at``) after step ``after``, by step."""
        ...

    def rollout_columns(self) -> list[str]:
        """The columns of the store's ``rollouts`` table."""
        ...

    def rollout_count(self, run_id: str) -> int:
        """How many rollouts of ``run_id`` the store holds."""
        ...

    def view(self, name: RunView, run_id: str) -> pa.Table:
        """The per-run view ``name`` of ``run_id``, aggregated store-side."""
        ...

    def episode_figures(self, run_id: str) -> dict[str, Any]:
        """The run's multi-turn episodes' figures (gfcr.doctor.checks_agentic reads them):
        ``episodes``, ``tool_rows``, ``error_loops``, ``format_rows``,
        ``no_policy_tokens``, ``ended``, ``turn_limit``, ``first_step``, ``last_step``
        (zeros for a single-turn run) and ``loop_error`` (the commonest repeated tool
        error, or None)."""
        ...

    def chat_samples(self, run_id: str, n: int) -> pa.Table:
        """Up to ``n`` multi-turn rows of the run (more than one exchange, or a tool
        turn), one per kind (right, wrong, tool error, unscored), each the latest:
        ``rollout_id``, ``step``, ``prompt``, ``reward``, ``turns``, ``kind``."""
        ...

    def evaluations(self, run_id: str) -> pa.Table:
        """Held-out accuracies (``step``, ``accuracy``, ``label``), by step: the
        ``evaluations`` table's where it holds the run's, else the ``heldout_accuracy``
        step metric's (labelled ``step=N``)."""
        ...

    def samples(self, run_id: str, steps: Sequence[int]) -> pa.Table:
        """At each of ``steps``, one row of each ``kind`` (right, wrong, dropped,
        unscored): ``step``, ``kind``, ``prompt``, ``completion``, ``answer``, ``reward``,
        ``dropped_by``, ``drop_reason``, ``finish_reason``; by step and kind."""
        ...


class StoreBackend(Protocol):
    """Opens stores and reads their history; ``errors`` are what its calls raise for bad
    input (a missing store, a read-only one written to, a run another process holds),
    reported without a traceback. Everything gfcr does with a store goes through it."""

    errors: tuple[type[Exception], ...]

    def open(self, uri: str | os.PathLike[str], *, read_only: bool = False,
             create: bool = True) -> RunStore: ...

    def history(self, store: Any, run_id: str | None, *, as_of_step: int | None = None,
                as_of_snapshot: int | None = None) -> History: ...

    def export(self, store: Any, dest: Path, *, format: str, table: str,
               match: Mapping[str, Any] | None) -> Path:
        """Write ``table``'s rows whose columns equal ``match``'s values (a (low, high)
        pair: a range) to ``dest``; typed conditions, never SQL text."""
        ...

    def reads(self, store: Any) -> RunReads:
        """The named reads of the open ``store``'s runs."""
        ...

    def browse(self, store: Any) -> BrowseReads:
        """The reads a live view (``gfcr ui``) makes of the open ``store``."""
        ...

    def compact(self, store: Any) -> Any: ...

    def hold(self, store: Any, run_id: str) -> AbstractContextManager[HeldLease]:
        """The run's lease, held while the block runs: one owner per run id."""
        ...

    def leases(self, uri: str | os.PathLike[str]) -> Mapping[str, Lease]:
        """Every run lease the store at ``uri`` holds, by run id (none: no store there);
        read without opening the store."""
        ...

    def duckdb_script(self, uri: str | os.PathLike[str]) -> str:
        """A DuckDB SQL script that opens the store at ``uri`` read-only, with the shipped
        views (``gfcr sql --script``, DuckDB's UI)."""
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


_OPEN: dict[str, RunStore] = {}
_OPENING = threading.Lock()


def other_store(uri: str, *, as_of_snapshot: int | None = None,
                run_id: str | None = None) -> History:
    """The history of the store at ``uri``, read-only, as of ``as_of_snapshot`` (None:
    live), for every run or for ``run_id`` alone (an engine worker's view of the run's
    own store). The store is opened once per process and kept open (stages of a run read
    it every step); the backend's ``errors`` say when it is not a store."""
    with _OPENING:
        if uri not in _OPEN:
            _OPEN[uri] = backend().open(uri, read_only=True, create=False)
    return backend().history(_OPEN[uri], run_id, as_of_snapshot=as_of_snapshot)
