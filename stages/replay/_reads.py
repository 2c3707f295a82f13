"""Reads the replay stages make from the rollout store, as SQL through its public API.

Every query reads the run's rows at the snapshot the step's ``History`` is pinned to
(``History(store, run_id, as_of_step=step - 1)``, see :mod:`store.history`), so a resumed
run — or a stage called again later with the same history — reads exactly the rows the
original step read, whatever was committed since. ``History`` has per-prompt totals and
per-group statistics; the replay stages also need evidence *discounted by age* and the
rows themselves, so the queries here go through ``history.store.sql`` (read-only) over
``lake.rollouts AT (VERSION => snapshot)``.

An *attempt* is what ``store.views`` calls one: a complete, scored, original
(``replay_count = 0``) rollout; a success is an attempt with ``reward > 0``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from gfcr.rollout import ROLLOUT_SCHEMA, conform

ATTEMPT = "status = 'complete' AND reward IS NOT NULL AND replay_count = 0"
"""SQL condition of an attempt (the same as the store's ``prompt_history`` view)."""


def source(history: Any, table: str = "rollouts") -> str:
    """A FROM-clause source for the run's rows of ``table`` at the history's snapshot."""
    at = "" if history.snapshot is None else f" AT (VERSION => {int(history.snapshot)})"
    where = "" if history.run_id is None else f" WHERE run_id = {_literal(history.run_id)}"
    return f"(SELECT * FROM lake.{table}{at}{where}) AS {table}"


def prompt_evidence(history: Any, *, now: int, half_life: float | None) -> pa.Table:
    """Per prompt: discounted attempts ``n`` and successes ``s``, and ``last_step``.

    An attempt at step ``t`` weighs ``0.5 ** ((now - t) / half_life)`` (1 when
    ``half_life`` is None), so the evidence of a policy long gone fades.
    """
    weight = "1.0" if half_life is None else f"pow(0.5, ({int(now)} - step) / {float(half_life)})"
    query = f"""
        SELECT prompt_id, sum({weight})::DOUBLE AS n,
               sum(CASE WHEN reward > 0 THEN {weight} ELSE 0 END)::DOUBLE AS s,
               max(step)::BIGINT AS last_step
        FROM {source(history)} WHERE {ATTEMPT}
        GROUP BY prompt_id ORDER BY prompt_id"""
    return history.store.sql(query)


def step_losses(history: Any) -> pa.Table:
    """Per (step, prompt): attempts and failure rate (1 - share of successes)."""
    query = f"""
        SELECT step, prompt_id, count(*)::BIGINT AS n,
               avg(CASE WHEN reward > 0 THEN 0.0 ELSE 1.0 END) AS loss
        FROM {source(history)} WHERE {ATTEMPT}
        GROUP BY step, prompt_id ORDER BY step, prompt_id"""
    return history.store.sql(query)


def recent_trained(history: Any, *, now: int, window: int) -> pa.Table:
    """Original rollouts the run kept and trained on in the last ``window`` steps, in
    groups whose kept rewards are not all equal (a flat group has no GRPO signal), with
    ``_times``: how often each was replayed already. Ordered newest step first."""
    src = source(history)
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
    return history.store.sql(query)


def as_rollouts(table: pa.Table, *, keep: tuple[str, ...] = ()) -> pa.Table:
    """DuckDB's result cast to ROLLOUT_SCHEMA, keeping only the extra columns ``keep``."""
    names = [n for n in table.column_names if n in ROLLOUT_SCHEMA.names or n in keep]
    return conform(table.select(names), where="stored rollouts")


def global_rate(evidence: pa.Table) -> float:
    """The run's (discounted) pass rate, smoothed by Beta(1, 1): 1/2 with no evidence."""
    n = float(np.sum(evidence.column("n").to_numpy())) if evidence.num_rows else 0.0
    s = float(np.sum(evidence.column("s").to_numpy())) if evidence.num_rows else 0.0
    return (1.0 + s) / (2.0 + n)


def _literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"
