"""LakeHistory: the typed read API that replay and curriculum stages use, with time travel.

A ``LakeHistory`` is a view of the store's past, optionally restricted to one run and pinned
to a DuckLake snapshot. Pinning makes resume exact: the loop reads the history *as of its
last committed step* (``LakeHistory(store, run_id=r, as_of_step=n - 1)`` before step ``n``),
and since every commit is one snapshot, a run resumed after a crash reads exactly the
rows — and so draws exactly the prompts — that the original run did, even if other runs
have committed since.

Stages read rows with ``rows(filter, columns=...)``: a typed ``gfcr.core.row_filter.RowFilter``
that becomes a WHERE clause with bound parameters (``store._rows``), so the conditions
and the projection reach the Parquet scan; each stage aggregates what it reads itself,
in Arrow. The per-prompt and per-step numbers come from the shipped views
(``store.views``, where the definitions are); results are Arrow tables with the fixed
schemas below, so stages can rely on the types.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import duckdb
import pyarrow as pa

from gfcr.core.row_filter import EVERY_ROW, Order, RowFilter

from . import _compat, _rows
from ._location import StoreError
from .lake import RolloutStore
from .views import EW_HALF_LIFE, view_query

PROMPT_STATS_SCHEMA = pa.schema([
    ("prompt_id", pa.string()), ("task", pa.string()), ("attempts", pa.int64()),
    ("successes", pa.int64()), ("last_step", pa.int64()), ("posterior_mean", pa.float64()),
    ("posterior_var", pa.float64()), ("ew_pass_rate", pa.float64()),
])
"""One row per prompt; see ``store.views`` for the definitions."""

GROUP_STATS_SCHEMA = pa.schema([
    ("run_id", pa.string()), ("step", pa.int64()), ("group_id", pa.string()), ("prompt_id", pa.string()),
    ("size", pa.int64()), ("n_kept", pa.int64()), ("pass_rate", pa.float64()),
    ("reward_mean", pa.float64()), ("reward_std", pa.float64()),
])
"""One row per (run, step, group)."""

LINEAGE_SCHEMA = pa.schema([
    ("depth", pa.int64()), ("rollout_id", pa.string()), ("parent_id", pa.string()), ("run_id", pa.string()),
    ("step", pa.int64()), ("dropped_by", pa.string()), ("drop_reason", pa.string()),
    ("consumed_at_step", pa.int64()), ("replay_count", pa.int32()), ("status", pa.string()),
    ("finish_reason", pa.string()),
])
"""A rollout (depth 0) and its ancestors through ``parent_id`` (depth 1, 2, ...)."""


class LakeHistory:
    """The store's history, optionally for one run and as of a snapshot or a step.

    ``as_of_step`` needs ``run_id`` and pins the snapshot that committed that step;
    ``as_of_snapshot`` pins a DuckLake snapshot id directly. Neither: the live store.
    ``rows``, ``prompt_stats`` and ``step_metrics`` are the reads stages have
    (gfcr.core.storage.History); ``group_stats`` and ``lineage`` read the shipped views of the
    same name for tools and tests.
    """

    def __init__(self, store: RolloutStore, run_id: str | None = None, *,
                 as_of_snapshot: int | None = None, as_of_step: int | None = None,
                 half_life: float = EW_HALF_LIFE):
        if as_of_snapshot is not None and as_of_step is not None:
            raise ValueError("give as_of_snapshot or as_of_step, not both")
        if as_of_step is not None:
            if run_id is None:
                raise ValueError(f"as_of_step={as_of_step!r} needs run_id (steps are numbered per run)")
            as_of_snapshot = store.step_snapshot(run_id, as_of_step)
            if as_of_snapshot is None:
                raise StoreError(f"step {as_of_step} of run {run_id!r} is not committed in store {store.uri!r}")
        self.store = store
        self.run_id = run_id
        self.snapshot = as_of_snapshot
        self.half_life = half_life
        self._have: tuple[str, ...] | None = None
        self._at_snapshot: str | None = None

    def __repr__(self) -> str:
        return f"LakeHistory({self.store.uri!r}, run_id={self.run_id!r}, snapshot={self.snapshot!r})"

    @property
    def uri(self) -> str:
        """The store's location."""
        return self.store.uri

    def prompt_stats(self, prompt_ids: Sequence[str] | None = None) -> pa.Table:
        """Per-prompt attempts, successes, Beta posterior and EW pass rate.

        With ``prompt_ids``, one row per id in that order; a prompt never attempted gets
        0 attempts and the Beta(1, 1) prior (mean 1/2, variance 1/12).
        """
        source, params = self._source("rollouts", prompt_ids=prompt_ids)
        body = view_query("prompt_history", rollouts=source, half_life=self.half_life)
        if prompt_ids is None:
            return self._query(f"SELECT * FROM ({body}) ORDER BY prompt_id", params, PROMPT_STATS_SCHEMA)
        query = f"""
            SELECT ids.prompt_id, h.task, coalesce(h.attempts, 0) AS attempts,
                   coalesce(h.successes, 0) AS successes, h.last_step,
                   coalesce(h.posterior_mean, 0.5) AS posterior_mean,
                   coalesce(h.posterior_var, 1.0 / 12) AS posterior_var, h.ew_pass_rate
            FROM (SELECT unnest($prompt_ids::VARCHAR[]) AS prompt_id,
                         generate_subscripts($prompt_ids::VARCHAR[], 1) AS i) ids
            LEFT JOIN ({body}) h USING (prompt_id)
            ORDER BY ids.i"""
        return self._query(query, {**params, "prompt_ids": list(prompt_ids)}, PROMPT_STATS_SCHEMA)

    def group_stats(self, step: int | None = None, prompt_ids: Sequence[str] | None = None) -> pa.Table:
        """Per-group size, kept count, pass rate and reward mean/std, optionally of one step."""
        source, params = self._source("rollouts", prompt_ids=prompt_ids, step=step)
        body = view_query("group_stats", rollouts=source)
        return self._query(f"SELECT * FROM ({body}) ORDER BY run_id, step, group_id", params, GROUP_STATS_SCHEMA)

    def step_metrics(self, run_id: str | None = None) -> pa.Table:
        """The ``steps`` rows (policy version, counts, metrics map) of a run, by step."""
        run = run_id if run_id is not None else self.run_id
        source, params = self._source("steps", run_id=run)
        body = view_query("step_metrics", steps=source)
        return self._query(f"SELECT * FROM ({body}) ORDER BY run_id, step", params, None)

    def lineage(self, rollout_id: str) -> pa.Table:
        """``rollout_id`` and its chain of parents (continuations, branches), nearest first."""
        source, params = self._source("rollouts")
        query = f"""
            WITH RECURSIVE chain(depth, rollout_id) AS (
                SELECT 0::BIGINT, $rollout_id::VARCHAR
                UNION ALL
                SELECT chain.depth + 1, rollouts.parent_id FROM chain JOIN {source} USING (rollout_id)
                WHERE rollouts.parent_id IS NOT NULL AND chain.depth < 1000
            )
            SELECT chain.depth, lineage.* FROM chain
            JOIN ({view_query('lineage', rollouts=source)}) lineage USING (rollout_id)
            ORDER BY chain.depth"""
        return self._query(query, {**params, "rollout_id": rollout_id}, LINEAGE_SCHEMA)

    def rows(self, filter: RowFilter = EVERY_ROW, *, columns: Sequence[str] | None = None,
             order_by: Order = (), limit: int | None = None) -> pa.Table:
        """The ``rollouts`` rows meeting ``filter`` at the pinned snapshot (the history's
        run unless ``filter.run_ids`` names others): ``columns`` (None: all, with every
        extra column the store has), by ``order_by``, at most ``limit``. The filter, the
        projection and the limit run in DuckDB, on the Parquet scan."""
        if not isinstance(filter, RowFilter):
            raise TypeError(f"rows: filter must be a gfcr.core.row_filter.RowFilter, not "
                            f"{type(filter).__name__} (the store takes no SQL conditions)")
        have = self._columns() if columns is not None or order_by else ()
        sql, params = _rows.query(self._rollouts(), filter, run_id=self.run_id,
                                  have=have, columns=columns, order_by=order_by, limit=limit)
        return self.store.sql(sql, params)

    def _columns(self) -> tuple[str, ...]:
        """The rollouts table's columns at the snapshot (kept when pinned: they cannot change)."""
        if self._have is None or self.snapshot is None:
            self._have = tuple(self.store.sql(f"SELECT * FROM {self._rollouts()} LIMIT 0").column_names)
        return self._have

    def _rollouts(self) -> str:
        """``rollouts`` at the snapshot as today's schema: the live table (on an older store
        read-only, the view store._compat made), or the table as of the snapshot, through
        store._compat where the store's version then is older than today's (a resumed run
        reads its steps from before the store was migrated)."""
        if self.snapshot is None:
            return "rollouts"
        if self._at_snapshot is None:
            at = f"lake.rollouts{self._at()}"
            have = self.store.sql(f"SELECT * FROM {at} LIMIT 0").column_names
            compat = _compat.select("rollouts", have, self._version(), at)
            self._at_snapshot = at if compat is None else f"({compat})"
        return self._at_snapshot

    def _version(self) -> int:
        """The store's schema version at the snapshot (store._versions; 1: none recorded)."""
        try:
            found = self.store.sql(f"SELECT max(version) AS v FROM lake.schema_versions{self._at()}")
        except duckdb.Error:  # the table did not exist yet
            return 1
        value = found.column("v")[0].as_py()
        return 1 if value is None else int(value)

    def _at(self) -> str:
        return "" if self.snapshot is None else f" AT (VERSION => {int(self.snapshot)})"

    def _source(self, table: str, *, run_id: str | None = None, prompt_ids: Sequence[str] | None = None,
                step: int | None = None) -> tuple[str, dict[str, Any]]:
        """A FROM-clause source for ``table`` at the pinned snapshot, named ``table``,
        filtered as asked (``run_id`` defaults to the history's run), and its parameters."""
        only = RowFilter(run_ids=None if run_id is None else (run_id,), step_min=step, step_max=step,
                         prompt_ids=None if prompt_ids is None else tuple(prompt_ids))
        terms, params = _rows.where(only, run_id=self.run_id)
        clause = f" WHERE {' AND '.join(terms)}" if terms else ""
        source = self._rollouts() if table == "rollouts" else f"lake.{table}{self._at()}"
        return f"(SELECT * FROM {source}{clause}) AS {table}", params

    def _query(self, query: str, params: dict | None, schema: pa.Schema | None) -> pa.Table:
        table = self.store.sql(query, params or None)
        return table if schema is None else table.cast(schema)
