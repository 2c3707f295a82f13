"""The store's named reads of its runs (gfcr.core.storage.RunReads): what ``gfcr runs``, the
report, the doctor, resume and the tracker read, with the SQL here, store-side.

Every read is read-only, through the store's read connection, with its values bound as
parameters; the per-run aggregates are the views of ``store.run_views``. A store of an
older schema version reads as today's (``store._compat``), so no read checks for columns
an older gfcr did not write.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from .lake import RolloutStore
from .run_views import CHAT_PICKS, EPISODE_FIGURES, LOOP_ERROR, RUN_VIEWS

_RUNS = ("SELECT run_id, pipeline, status, started_at, finished_at, spec_hash, error "
         "FROM runs ORDER BY started_at")

_KIND = ("CASE WHEN NOT kept THEN 'dropped' WHEN reward >= 1 THEN 'right' "
         "WHEN reward IS NOT NULL THEN 'wrong' ELSE 'unscored' END")


class LakeRunReads:
    """Named reads of ``store``'s runs; see gfcr.core.storage.RunReads for each contract."""

    def __init__(self, store: RolloutStore):
        self.store = store

    def run(self, run_id: str) -> dict[str, Any] | None:
        rows = self.store.sql("SELECT * FROM runs WHERE run_id = $run", {"run": run_id}).to_pylist()
        return rows[0] if rows else None

    def latest_run_ids(self, limit: int) -> list[str]:
        table = self.store.sql("SELECT run_id FROM runs ORDER BY started_at DESC LIMIT $n", {"n": int(limit)})
        return [str(r) for r in table.column("run_id").to_pylist()]

    def runs(self) -> pa.Table:
        return self.store.sql(_RUNS)

    def steps(self, run_id: str, *, after: int | None = None) -> pa.Table:
        query = ("SELECT step, policy_version, n_rollouts, n_kept, metrics, committed_at FROM steps "
                 "WHERE run_id = $run {after} ORDER BY step")
        if after is None:
            return self.store.sql(query.format(after=""), {"run": run_id})
        return self.store.sql(query.format(after="AND step > $after"), {"run": run_id, "after": int(after)})

    def rollout_columns(self) -> list[str]:
        return list(self.store.sql("SELECT * FROM rollouts LIMIT 0").column_names)

    def rollout_count(self, run_id: str) -> int:
        table = self.store.sql("SELECT count(*) AS n FROM rollouts WHERE run_id = $run", {"run": run_id})
        return int(table.column("n")[0].as_py())

    def view(self, name: str, run_id: str) -> pa.Table:
        if name not in RUN_VIEWS:
            raise KeyError(f"no run view {name!r}; the store has {sorted(RUN_VIEWS)}")
        return self.store.sql(RUN_VIEWS[name], {"run": run_id})

    def evaluations(self, run_id: str) -> pa.Table:
        found = self.store.sql("SELECT step, accuracy, coalesce(label, '') AS label FROM evaluations "
                               "WHERE run_id = $run AND coalesce(eval_set, 'heldout') = 'heldout' "
                               "ORDER BY step, evaluated_at", {"run": run_id})
        if found.num_rows:
            return found
        return self.store.sql(
            "SELECT step + 1 AS step, metrics['heldout_accuracy'] AS accuracy, "
            "'step=' || (step + 1)::VARCHAR AS label FROM steps "
            "WHERE run_id = $run AND metrics['heldout_accuracy'] IS NOT NULL ORDER BY step", {"run": run_id})

    def samples(self, run_id: str, steps: Sequence[int]) -> pa.Table:
        params = {"run": run_id, "steps": [int(s) for s in steps]}
        ids = self.store.sql(
            f"SELECT arg_min(rollout_id, hash(rollout_id)) AS rollout_id FROM rollouts "
            f"WHERE run_id = $run AND list_contains($steps::BIGINT[], step) GROUP BY step, {_KIND}",
            params).column("rollout_id").to_pylist()
        return self.store.sql(
            f"SELECT step, {_KIND} AS kind, prompt, completion, answer, reward, dropped_by, "
            "drop_reason, finish_reason FROM rollouts WHERE run_id = $run "
            "AND list_contains($steps::BIGINT[], step) AND list_contains($ids::VARCHAR[], rollout_id) "
            "ORDER BY step, kind", {**params, "ids": ids})

    def episode_figures(self, run_id: str) -> dict[str, Any]:
        columns = self.rollout_columns()
        end = "episode_end" if "episode_end" in columns else "NULL::VARCHAR"
        params = {"run": run_id}
        figures = {k: int(v or 0) for k, v in
                   self.store.sql(EPISODE_FIGURES.format(end=end), params).to_pylist()[0].items()}
        loop = self.store.sql(LOOP_ERROR, params).to_pylist()
        return {**figures, "loop_error": loop[0] if loop else None}

    def chat_samples(self, run_id: str, n: int) -> pa.Table:
        picked = self.store.sql(CHAT_PICKS, {"run": run_id, "n": int(n)}).to_pylist()
        kinds = {r["rollout_id"]: r["kind"] for r in picked}
        rows = self.store.sql(
            "SELECT rollout_id, step, prompt, reward, turns FROM rollouts WHERE run_id = $run "
            "AND list_contains($ids::VARCHAR[], rollout_id) ORDER BY step, rollout_id",
            {"run": run_id, "ids": list(kinds)})
        return rows.append_column("kind", pa.array([kinds[r] for r in rows.column("rollout_id").to_pylist()],
                                                   pa.string()))
