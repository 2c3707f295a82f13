"""History: the typed read API that replay and curriculum stages use, with time travel.

A ``History`` is a view of the store's past, optionally restricted to one run and pinned
to a DuckLake snapshot. Pinning makes resume exact: the loop reads the history *as of its
last committed step* (``History(store, run_id=r, as_of_step=n - 1)`` before step ``n``),
and since every commit is one snapshot, a run resumed after a crash reads exactly the
rows — and so draws exactly the prompts — that the original run did, even if other runs
have committed since.

The numbers come from the shipped views (``store.views``, where the definitions are);
results are Arrow tables with the fixed schemas below, so stages can rely on the types.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from ._duck import quote_literal
from ._location import StoreError
from .lake import RolloutStore
from .views import EW_HALF_LIFE, view_query

ATTEMPT = "status = 'complete' AND reward IS NOT NULL AND replay_count = 0"
"""SQL condition of an attempt: a complete, scored, original rollout (the same as the
``prompt_history`` view's)."""

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


class History:
    """The store's history, optionally for one run and as of a snapshot or a step.

    ``as_of_step`` needs ``run_id`` and pins the snapshot that committed that step;
    ``as_of_snapshot`` pins a DuckLake snapshot id directly. Neither: the live store.
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

    def __repr__(self) -> str:
        return f"History({self.store.uri!r}, run_id={self.run_id!r}, snapshot={self.snapshot!r})"

    @property
    def uri(self) -> str:
        """The store's location."""
        return self.store.uri

    def prompt_stats(self, prompt_ids: Sequence[str] | None = None) -> pa.Table:
        """Per-prompt attempts, successes, Beta posterior and EW pass rate.

        With ``prompt_ids``, one row per id in that order; a prompt never attempted gets
        0 attempts and the Beta(1, 1) prior (mean 1/2, variance 1/12).
        """
        source = self._source("rollouts", prompt_ids=prompt_ids)
        body = view_query("prompt_history", rollouts=source, half_life=self.half_life)
        if prompt_ids is None:
            return self._query(f"SELECT * FROM ({body}) ORDER BY prompt_id", None, PROMPT_STATS_SCHEMA)
        query = f"""
            SELECT ids.prompt_id, h.task, coalesce(h.attempts, 0) AS attempts,
                   coalesce(h.successes, 0) AS successes, h.last_step,
                   coalesce(h.posterior_mean, 0.5) AS posterior_mean,
                   coalesce(h.posterior_var, 1.0 / 12) AS posterior_var, h.ew_pass_rate
            FROM (SELECT unnest($prompt_ids::VARCHAR[]) AS prompt_id,
                         generate_subscripts($prompt_ids::VARCHAR[], 1) AS i) ids
            LEFT JOIN ({body}) h USING (prompt_id)
            ORDER BY ids.i"""
        return self._query(query, {"prompt_ids": list(prompt_ids)}, PROMPT_STATS_SCHEMA)

    def group_stats(self, step: int | None = None, prompt_ids: Sequence[str] | None = None) -> pa.Table:
        """Per-group size, kept count, pass rate and reward mean/std, optionally of one step."""
        source = self._source("rollouts", prompt_ids=prompt_ids, step=step)
        body = view_query("group_stats", rollouts=source)
        params = None if prompt_ids is None else {"prompt_ids": list(prompt_ids)}
        return self._query(f"SELECT * FROM ({body}) ORDER BY run_id, step, group_id", params, GROUP_STATS_SCHEMA)

    def step_metrics(self, run_id: str | None = None) -> pa.Table:
        """The ``steps`` rows (policy version, counts, metrics map) of a run, by step."""
        run = run_id if run_id is not None else self.run_id
        body = view_query("step_metrics", steps=self._source("steps", run_id=run))
        return self._query(f"SELECT * FROM ({body}) ORDER BY run_id, step", None, None)

    def lineage(self, rollout_id: str) -> pa.Table:
        """``rollout_id`` and its chain of parents (continuations, branches), nearest first."""
        source = self._source("rollouts")
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
        return self._query(query, {"rollout_id": rollout_id}, LINEAGE_SCHEMA)

    # ------------------------------------------------------------ reads of replay and control stages

    def prompt_evidence(self, *, now: int, half_life: float | None) -> pa.Table:
        """Per prompt: discounted attempts ``n`` and successes ``s``, and ``last_step``.

        An attempt at step ``t`` weighs ``0.5 ** ((now - t) / half_life)`` (1 when
        ``half_life`` is None), so the evidence of a policy long gone fades.
        """
        weight = "1.0" if half_life is None else f"pow(0.5, ({int(now)} - step) / {float(half_life)})"
        query = f"""
            SELECT prompt_id, sum({weight})::DOUBLE AS n,
                   sum(CASE WHEN reward > 0 THEN {weight} ELSE 0 END)::DOUBLE AS s,
                   max(step)::BIGINT AS last_step
            FROM {self._source("rollouts")} WHERE {ATTEMPT}
            GROUP BY prompt_id ORDER BY prompt_id"""
        return self.store.sql(query)

    def step_losses(self) -> pa.Table:
        """Per (step, prompt): attempts ``n`` and failure rate ``loss`` (1 - share of
        successes)."""
        query = f"""
            SELECT step, prompt_id, count(*)::BIGINT AS n,
                   avg(CASE WHEN reward > 0 THEN 0.0 ELSE 1.0 END) AS loss
            FROM {self._source("rollouts")} WHERE {ATTEMPT}
            GROUP BY step, prompt_id ORDER BY step, prompt_id"""
        return self.store.sql(query)

    def recent_trained(self, *, now: int, window: int) -> pa.Table:
        """Original rollouts the run kept and trained on in the last ``window`` steps, in
        groups whose kept rewards are not all equal (a flat group has no GRPO signal), with
        ``_times``: how often each was replayed already. Ordered newest step first."""
        src = self._source("rollouts")
        recent = f"rollouts.step >= {int(now) - int(window)}"
        query = f"""
            WITH used AS (
                SELECT parent_id, count(*)::BIGINT AS times FROM {src}
                WHERE replay_count > 0 AND parent_id IS NOT NULL GROUP BY parent_id),
            signal AS (
                SELECT group_id FROM {src} WHERE kept AND {recent} AND replay_count = 0
                GROUP BY group_id HAVING max(reward) > min(reward))
            SELECT rollouts.*, coalesce(used.times, 0)::BIGINT AS _times
            FROM {src} LEFT JOIN used ON used.parent_id = rollouts.rollout_id
            WHERE rollouts.kept AND rollouts.consumed_at_step IS NOT NULL
              AND rollouts.status = 'complete' AND rollouts.replay_count = 0 AND {recent}
              AND rollouts.group_id IN (SELECT group_id FROM signal)
            ORDER BY rollouts.step DESC, rollouts.group_id, rollouts.sample_idx"""
        return self.store.sql(query)

    def recent_outcomes(self, *, since_step: int, limit: int, run_id: str | None = None) -> pa.Table:
        """``logprobs`` and ``reward`` of the run's attempts from ``since_step`` on, newest
        first (then by rollout id), at most ``limit`` rows."""
        source = self._source("rollouts", run_id=run_id, step_from=since_step)
        query = f"""
            SELECT logprobs, reward FROM {source}
            WHERE {ATTEMPT} ORDER BY step DESC, rollout_id LIMIT {int(limit)}"""
        return self.store.sql(query)

    def pending_partials(self, run_id: str | None = None) -> pa.Table:
        """Partial rows of the run that no row continues yet, oldest step first, with every
        column the store has: extra ones (``hint_tokens``, ...) exist only where a stage
        wrote them."""
        query = f"""
            SELECT p.* FROM {self._source("rollouts", run_id=run_id, alias="p")}
            WHERE p.status = 'partial' AND NOT EXISTS (
                SELECT 1 FROM {self._source("rollouts", run_id=run_id, alias="c")}
                WHERE c.parent_id = p.rollout_id)
            ORDER BY p.step, p.group_id, p.sample_idx"""
        return self.store.sql(query)

    def tool_error_rows(self, *, since_step: int, limit: int) -> pa.Table:
        """Attempts of the run from ``since_step`` on with a turn whose ``tool_error`` is
        set and no row naming them as ``parent_id``, newest step first (then by rollout
        id), at most ``limit``, with every column the store has."""
        query = f"""
            SELECT p.* FROM {self._source("rollouts", step_from=since_step, alias="p")}
            WHERE {ATTEMPT} AND p.turns IS NOT NULL
              AND len(list_filter(p.turns, lambda t: t.tool_error IS NOT NULL)) > 0
              AND NOT EXISTS (SELECT 1 FROM {self._source("rollouts", alias="c")}
                              WHERE c.parent_id = p.rollout_id)
            ORDER BY p.step DESC, p.rollout_id LIMIT {int(limit)}"""
        return self.store.sql(query)

    def candidate_groups(self, where: str, *, exclude_run: str) -> pa.Table:
        """``run_id``, ``group_id`` of the groups of runs other than ``exclude_run`` with a
        complete, scored row that meets the SQL condition ``where``, in that order."""
        query = (f"SELECT DISTINCT run_id, group_id FROM {self._scored(exclude_run)} "
                 f"WHERE ({where}) ORDER BY run_id, group_id")
        return self.store.sql(query)

    def group_rows(self, groups: Sequence[tuple[str, str]], *, exclude_run: str) -> pa.Table:
        """The complete, scored rows of the (run id, group id) ``groups`` (none of
        ``exclude_run``), by run, group and sample."""
        wanted = [f"{run}\x00{group}" for run, group in groups]
        query = f"""
            SELECT * FROM {self._scored(exclude_run)}
            WHERE list_contains($wanted::VARCHAR[], run_id || chr(0) || group_id)
            ORDER BY run_id, group_id, sample_idx"""
        return self.store.sql(query, {"wanted": wanted})

    def _scored(self, exclude_run: str) -> str:
        """The complete, scored rollouts of every run but ``exclude_run``, as ``rollouts``."""
        return (f"(SELECT * FROM lake.rollouts{self._at()} WHERE status = 'complete' AND reward IS NOT NULL"
                f" AND run_id <> {quote_literal(exclude_run)}) AS rollouts")

    def _at(self) -> str:
        return "" if self.snapshot is None else f" AT (VERSION => {int(self.snapshot)})"

    def _source(self, table: str, *, run_id: str | None = None, prompt_ids: Sequence[str] | None = None,
                step: int | None = None, step_from: int | None = None, alias: str | None = None) -> str:
        """A FROM-clause source for ``table`` at the pinned snapshot, filtered as asked
        (``run_id`` defaults to the history's run), named ``alias`` (default: ``table``)."""
        run = run_id if run_id is not None else self.run_id
        where = []
        if run is not None:
            where.append(f"run_id = {quote_literal(run)}")
        if step is not None:
            where.append(f"step = {int(step)}")
        if step_from is not None:
            where.append(f"step >= {int(step_from)}")
        if prompt_ids is not None:
            where.append("list_contains($prompt_ids::VARCHAR[], prompt_id)")
        clause = f" WHERE {' AND '.join(where)}" if where else ""
        return f"(SELECT * FROM lake.{table}{self._at()}{clause}) AS {alias or table}"

    def _query(self, query: str, params: dict | None, schema: pa.Schema | None) -> pa.Table:
        table = self.store.sql(query, params)
        return table if schema is None else table.cast(schema)
