"""The reads of a live view (gfcr.core.browse.BrowseReads, ``gfcr ui``), with their SQL
here, store-side.

Every read goes through ``RolloutStore.sql`` (the read-only, sandboxed connection and the
SQL guard) with its values bound as parameters; a filter becomes a WHERE clause built
from fixed fragments, one per :class:`RolloutQuery` field. Reads stay cheap on a store of
millions of rows: the runs list and the live marker read the small ``runs``, ``steps``
and ``evaluations`` tables only, and a page of rollouts reads short prefixes of the texts.
A store written by an older gfcr reads as today's (``store._compat``); the ``server``
column, which only fleet runs write, reads as null where it is absent.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gfcr.core.browse import TEXT_CAP, RolloutPage, RolloutQuery

from .lake import RolloutStore

CLIP = 160
"""Characters of the prompt and completion a table row shows."""

_FILTERS: dict[str, str] = {
    "step": "step = $step",
    "stage": "dropped_by = $stage",
    "kept": "kept = $kept",
    "reason": "contains(coalesce(drop_reason, ''), $reason)",
    "reward_min": "reward >= $reward_min",
    "reward_max": "reward <= $reward_max",
    "len_min": "n_tokens >= $len_min",
    "len_max": "n_tokens <= $len_max",
    "server": "server = $server",
    "version": "policy_version_start = $version",
    "q": "(contains(lower(prompt), lower($q)) OR contains(lower(completion), lower($q)) "
         "OR rollout_id = $q)",
    "prompt_id": "prompt_id = $prompt_id",
    "group_id": "group_id = $group_id",
}
"""Per RolloutQuery field, its condition (its value bound under the field's name)."""

_OVERVIEW = """
WITH s AS (SELECT run_id, count(*) AS steps, max(step) AS last_step, sum(n_rollouts)::BIGINT AS rollouts,
                  arg_max(metrics['reward_mean'], step) AS reward,
                  arg_max(metrics['heldout_accuracy'], step)
                    FILTER (WHERE metrics['heldout_accuracy'] IS NOT NULL) AS step_accuracy,
                  epoch(max(committed_at) - min(committed_at)) AS span,
                  arg_min(n_rollouts, step) AS first_rollouts
           FROM steps GROUP BY run_id),
e AS (SELECT run_id, arg_max(accuracy, step) AS accuracy FROM evaluations GROUP BY run_id)
SELECT r.run_id, r.pipeline, r.status, r.started_at, r.finished_at, r.error,
       coalesce(s.steps, 0) AS steps, s.last_step, coalesce(s.rollouts, 0) AS rollouts, s.reward,
       coalesce(e.accuracy, s.step_accuracy) AS accuracy,
       CASE WHEN s.span > 0 THEN (s.rollouts - s.first_rollouts) / s.span END AS rollouts_per_s
FROM runs r LEFT JOIN s USING (run_id) LEFT JOIN e USING (run_id)
ORDER BY r.started_at DESC
"""

_ORDER = "step DESC, group_id, sample_idx, rollout_id"
"""The rollouts table's order: newest step first, then group and sample."""
_NO_KEYS = pa.table({"step": pa.array([], pa.int64()), "group_id": pa.array([], pa.string()),
                     "sample_idx": pa.array([], pa.int32()), "rollout_id": pa.array([], pa.string()),
                     "reward": pa.array([], pa.float64())})

class LakeBrowseReads:
    """The live view's reads of ``store``; see gfcr.core.browse.BrowseReads."""

    def __init__(self, store: RolloutStore):
        self.store = store
        self._columns: list[str] | None = None

    def columns(self) -> list[str]:
        if self._columns is None:
            self._columns = list(self.store.sql("SELECT * FROM rollouts LIMIT 0").column_names)
        return self._columns

    def runs_overview(self) -> pa.Table:
        return self.store.sql(_OVERVIEW)

    def marker(self, run_id: str) -> dict[str, Any] | None:
        rows = self.store.sql(
            "SELECT status, error, finished_at, "
            "(SELECT max(step) FROM steps WHERE run_id = $run) AS last_step, "
            "(SELECT count(*) FROM steps WHERE run_id = $run) AS steps "
            "FROM runs WHERE run_id = $run", {"run": run_id}).to_pylist()
        return rows[0] if rows else None

    def _where(self, run_id: str, query: RolloutQuery) -> tuple[str, dict[str, Any]]:
        have = set(self.columns())
        conditions, params = ["run_id = $run"], {"run": run_id}
        for name, fragment in _FILTERS.items():
            value = getattr(query, name)  # getattr: the query's own fields, by name
            if value is None:
                continue
            if name == "server" and "server" not in have:
                raise ValueError(f"server={value!r}: this store records no server (its rollouts "
                                 "have no 'server' column; only fleet runs write one)")
            conditions.append(fragment)
            params[name] = value
        return " AND ".join(conditions), params

    def rollouts(self, run_id: str, query: RolloutQuery) -> pa.Table:
        where, params = self._where(run_id, query)
        return self.store.sql(  # one top-N: DuckDB reads the wide columns of the page's rows only
            f"SELECT {self._shown()} FROM rollouts WHERE {where} ORDER BY {_ORDER} "
            "LIMIT $limit OFFSET $offset", {**params, "limit": query.limit, "offset": query.offset})

    def _shown(self) -> str:
        """The table's columns (texts clipped; server null where not stored)."""
        server = "server" if "server" in self.columns() else "NULL::VARCHAR AS server"
        return (f"rollout_id, step, group_id, sample_idx, prompt_id, left(prompt, {CLIP}) AS prompt, "
                f"left(completion, {CLIP}) AS completion, reward, advantage, kept, dropped_by, drop_reason, "
                f"n_tokens, finish_reason, status, policy_version_start, {server}, len(turns) AS n_turns")

    def _wide(self, run_id: str, keys: pa.Table) -> pa.Table:
        """The table columns of the rows ``keys`` (``step``, ``rollout_id``) only: the scan
        is pruned to their steps' files and reads the texts of those rows alone."""
        steps = keys.column("step")
        low, high = (pc.min(steps).as_py(), pc.max(steps).as_py()) if keys.num_rows else (0, -1)
        return self.store.sql(
            f"SELECT {self._shown()} "
            "FROM rollouts WHERE run_id = $run AND step BETWEEN $low AND $high "
            f"AND list_contains($ids::VARCHAR[], rollout_id) ORDER BY {_ORDER}",
            {"run": run_id, "low": low, "high": high, "ids": keys.column("rollout_id").to_pylist()})

    def page(self, run_id: str, query: RolloutQuery, bins: int, cap: int | None = TEXT_CAP) -> RolloutPage:
        if query.q is None or query.step is not None or cap is None:
            total, bars = self.histogram(run_id, query, bins)
            return RolloutPage(self.rollouts(run_id, query), total, bars)
        return self._text_page(run_id, query, bins, cap)

    def _text_page(self, run_id: str, query: RolloutQuery, bins: int, cap: int) -> RolloutPage:
        """A free-text filter over every step, newest steps first: one step, then as many
        steps as the matches per rollout so far say the rest needs, until ``cap``
        matches (and the page's rows) are found or no step is left: a substring scan of
        every text is what costs, so a common word stops early."""
        sizes = self.store.sql("SELECT step, sum(n_rollouts) AS n FROM steps WHERE run_id = $run "
                               "GROUP BY step ORDER BY step DESC", {"run": run_id}).to_pylist()
        steps = [r["step"] for r in sizes]
        where, params = self._where(run_id, query.without("reward_min", "reward_max"))
        found: list[pa.Table] = []
        start, end, in_range, scanned_rows = 0, 1, 0, 0
        while start < len(steps):
            window = steps[start:end]
            part = self.store.sql(
                f"SELECT step, group_id, sample_idx, rollout_id, reward FROM rollouts WHERE {where} "
                "AND step BETWEEN $w_low AND $w_high", {**params, "w_low": window[-1], "w_high": window[0]})
            found.append(part)
            in_range += _in_range(part, query).num_rows
            scanned_rows += sum(r["n"] or 0 for r in sizes[start:end])
            start, need = end, max(cap, query.offset + query.limit) - in_range
            if need <= 0:
                break
            wanted = need * scanned_rows / in_range if in_range else 2 * max(scanned_rows, 1)
            while end < len(steps) and (end == start or wanted > 0):  # the steps that rate asks for
                wanted -= sizes[end]["n"] or 0
                end += 1
        matched = pa.concat_tables(found) if found else _NO_KEYS
        ranged = _in_range(matched, query)
        keys = ranged.sort_by([("step", "descending"), ("group_id", "ascending"), ("sample_idx", "ascending"),
                               ("rollout_id", "ascending")]).slice(query.offset, query.limit)
        complete = start >= len(steps)
        scanned = (steps[min(start, len(steps)) - 1], steps[0]) if steps else None
        return RolloutPage(self._wide(run_id, keys), ranged.num_rows, _bars(matched.column("reward"), bins),
                           complete, scanned)

    def histogram(self, run_id: str, query: RolloutQuery, bins: int) -> tuple[int, pa.Table]:
        where, params = self._where(run_id, query.without("reward_min", "reward_max"))
        ranged = [c for c, v in (("reward >= $reward_min", query.reward_min),
                                 ("reward <= $reward_max", query.reward_max)) if v is not None]
        params |= {k: v for k, v in (("reward_min", query.reward_min),
                                     ("reward_max", query.reward_max)) if v is not None}
        bins = max(1, min(int(bins), 200))
        table = self.store.sql(  # one scan: the page's count rides along with the bins
            f"WITH r AS MATERIALIZED (SELECT reward FROM rollouts WHERE {where}), "
            f"b AS (SELECT min(reward) AS lo, max(reward) AS hi, "
            f"count(*) FILTER (WHERE {' AND '.join(ranged) or 'true'}) AS total FROM r), "
            "c AS (SELECT least(floor((reward - lo) / nullif(hi - lo, 0) * $bins), $bins - 1)::BIGINT AS bin, "
            "count(*) AS n FROM r, b WHERE reward IS NOT NULL GROUP BY 1) "
            "SELECT b.total, coalesce(c.bin, 0) AS bin, b.lo + coalesce(c.bin, 0) * (b.hi - b.lo) / $bins AS low, "
            "b.lo + (coalesce(c.bin, 0) + 1) * (b.hi - b.lo) / $bins AS high, c.n "
            "FROM b LEFT JOIN c ON true ORDER BY bin", {**params, "bins": bins})
        total = int(table.column("total")[0].as_py() or 0) if table.num_rows else 0
        bars = table.drop_columns(["total"]).filter(pc.is_valid(table.column("n")))
        return total, bars

    def rollout(self, run_id: str, rollout_id: str) -> dict[str, Any] | None:
        table = self.store.sql("SELECT * FROM rollouts WHERE run_id = $run AND rollout_id = $id LIMIT 1",
                               {"run": run_id, "id": rollout_id})
        if not table.num_rows:
            return None
        return dict(table.to_pylist()[0])

    def children(self, run_id: str, rollout_id: str) -> pa.Table:
        return self.store.sql(
            "SELECT run_id, step, rollout_id, reward, kept FROM rollouts "
            "WHERE run_id = $run AND parent_id = $id ORDER BY step, rollout_id LIMIT 50",
            {"run": run_id, "id": rollout_id})

    def prompt_rows(self, prompt_id: str, run_ids: Sequence[str], limit: int) -> pa.Table:
        return self.store.sql(
            f"SELECT run_id, step, rollout_id, group_id, sample_idx, left(prompt, {20 * CLIP}) AS prompt, "
            f"left(completion, {4 * CLIP}) AS completion, "
            "reward, advantage, kept, drop_reason, n_tokens FROM rollouts "
            "WHERE prompt_id = $prompt AND list_contains($runs::VARCHAR[], run_id) "
            "ORDER BY run_id, step, group_id, sample_idx LIMIT $n",
            {"prompt": prompt_id, "runs": list(run_ids), "n": int(limit)})

    def drop_reasons(self, run_id: str) -> pa.Table:
        return self.store.sql(
            "SELECT dropped_by, coalesce(drop_reason, '?') AS reason, count(*) AS n FROM rollouts "
            "WHERE run_id = $run AND NOT kept GROUP BY ALL ORDER BY n DESC LIMIT 50", {"run": run_id})

    def eval_completions(self, run_id: str, eval_set: str, labels: Sequence[str]) -> pa.Table:
        return self.store.sql(
            f"SELECT label, prompt_id, left(prompt, {4 * CLIP}) AS prompt, answer, "
            f"left(completion, {4 * CLIP}) AS completion, n_tokens, reward, correct, error "
            "FROM eval_completions WHERE run_id = $run AND eval_set = $set AND sample = 0 "
            "AND temperature = 0 AND (len($labels::VARCHAR[]) = 0 OR list_contains($labels::VARCHAR[], label)) "
            "ORDER BY prompt_id, label LIMIT 20000",
            {"run": run_id, "set": eval_set, "labels": list(labels)})


def _in_range(rows: pa.Table, query: RolloutQuery) -> pa.Table:
    """``rows`` whose reward lies in the query's range (a bound set excludes unscored rows)."""
    mask = None
    for bound, op in ((query.reward_min, pc.greater_equal), (query.reward_max, pc.less_equal)):
        if bound is not None:
            test = pc.fill_null(op(rows.column("reward"), bound), False)
            mask = test if mask is None else pc.and_(mask, test)
    return rows if mask is None else rows.filter(mask)


def _bars(rewards: pa.ChunkedArray, bins: int) -> pa.Table:
    """Equal reward bins over the scored ``rewards`` as LakeBrowseReads.histogram gives them
    (``bin``, ``low``, ``high``, ``n``; empty bins left out)."""
    bins = max(1, min(int(bins), 200))
    values = pc.drop_null(rewards).to_numpy()
    if not len(values):
        return pa.table({"bin": pa.array([], pa.int64()), "low": pa.array([], pa.float64()),
                         "high": pa.array([], pa.float64()), "n": pa.array([], pa.int64())})
    low, high = float(values.min()), float(values.max())
    index = (np.full(len(values), bins - 1, np.int64) if high == low  # as SQL's least(NULL, b)
             else np.minimum(np.floor((values - low) / (high - low) * bins), bins - 1).astype(np.int64))
    counts = np.bincount(index, minlength=bins)
    used = np.flatnonzero(counts)
    span = high - low  # the edges as the SQL histogram computes them, bit for bit
    return pa.table({"bin": used.astype(np.int64), "low": low + used * span / bins,
                     "high": low + (used + 1) * span / bins,
                     "n": counts[used].astype(np.int64)})
