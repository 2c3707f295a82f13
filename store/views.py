"""The store's shipped views: SQL over ``rollouts`` and ``steps``, declared once here.

Each view is a template whose ``{rollouts}`` and ``{steps}`` placeholders name a table
source. ``create_views`` instantiates them as temporary views over the live lake tables
on a connection (so ``SELECT * FROM prompt_history`` works in ``gfcr sql``);
``view_query`` instantiates one over any source, e.g. a time-travelled
``lake.rollouts AT (VERSION => 12)`` or a single run's rows, which is how
``store.history`` reads the history as it was at an earlier step.

Definitions (the numbers replay and curriculum stages act on):

- ``group_stats``: one row per (run, step, group). ``size`` counts every row of the group
  committed at that step; ``pass_rate`` is the mean of ``reward > 0`` and ``reward_mean``
  / ``reward_std`` (population std, 0 for one sample) the moments of ``reward``, all over
  rows whose reward is not null.
- ``prompt_history``: one row per prompt. An *attempt* is a complete, scored
  (``reward`` not null), original (``replay_count = 0``, so a replayed copy of a rollout is
  not counted twice) rollout; a success is an attempt with ``reward > 0``.
  ``posterior_mean`` / ``posterior_var`` are those of Beta(1 + successes, 1 + failures).
  ``ew_pass_rate`` weighs the attempts of step ``t`` by ``0.5 ** ((L - t) / half_life)``
  where ``L`` is the prompt's latest attempted step (half-life ``EW_HALF_LIFE`` steps by
  default); null when the prompt has no attempt. ``last_step`` is the latest step at
  which the prompt appears at all (partial and pruned rows included).
- ``step_metrics``: the ``steps`` table.
- ``lineage``: per rollout, its parent, who dropped it and why, the step whose update
  consumed it and how often it was replayed.
- ``turns``: one row per turn of each rollout (``gfcr.core.trajectory.TURN_TYPE``): ``run_id``,
  ``step``, ``rollout_id``, ``turn`` (0-based), ``role``, ``source``, ``n_tokens``,
  ``n_loss_tokens`` (tokens in the loss: its mask's true entries, 0 for a turn without
  a mask), ``tool_name``, ``tool_error``, ``reward`` (the turn's own, null: none) and
  ``logprob_sum`` (the sum of the turn's behaviour log-probabilities; null for a turn
  without any, an environment's or a tool's), from the stored ``turns`` (every row has
  them from schema version 4; a store of an older version opened read-only reads its
  rows' single-turn form, ``store._compat``).
"""

from __future__ import annotations

import duckdb

from . import _compat, _versions

EW_HALF_LIFE = 8.0
"""Default half-life, in steps, of the exponentially weighted pass rate."""

_GROUP_STATS = """
SELECT run_id, step, group_id, prompt_id,
       count(*)::BIGINT AS size,
       count_if(kept)::BIGINT AS n_kept,
       avg(CASE WHEN reward > 0 THEN 1.0 WHEN reward IS NOT NULL THEN 0.0 END) AS pass_rate,
       avg(reward) AS reward_mean,
       stddev_pop(reward) AS reward_std
FROM {rollouts}
GROUP BY run_id, step, group_id, prompt_id
"""

_PROMPT_HISTORY = """
WITH per_step AS (
    SELECT prompt_id, task, step,
           count_if(status = 'complete' AND reward IS NOT NULL AND replay_count = 0) AS n,
           count_if(status = 'complete' AND reward > 0 AND replay_count = 0) AS s
    FROM {rollouts}
    GROUP BY prompt_id, task, step
), weighted AS (
    SELECT *, max(CASE WHEN n > 0 THEN step END) OVER (PARTITION BY prompt_id, task) AS last_attempt
    FROM per_step
), per_prompt AS (
    SELECT prompt_id, task,
           sum(n)::BIGINT AS attempts,
           sum(s)::BIGINT AS successes,
           max(step) AS last_step,
           sum(s * pow(0.5, (last_attempt - step) / {half_life}))
             / nullif(sum(n * pow(0.5, (last_attempt - step) / {half_life})), 0) AS ew_pass_rate
    FROM weighted
    GROUP BY prompt_id, task
)
SELECT prompt_id, task, attempts, successes, last_step,
       (1.0 + successes) / (2.0 + attempts) AS posterior_mean,
       (1.0 + successes) * (1.0 + attempts - successes)
         / ((2.0 + attempts) * (2.0 + attempts) * (3.0 + attempts)) AS posterior_var,
       ew_pass_rate
FROM per_prompt
"""

_STEP_METRICS = """
SELECT run_id, step, policy_version, n_rollouts, n_kept, metrics, committed_at
FROM {steps}
"""

_LINEAGE = """
SELECT rollout_id, parent_id, run_id, step, dropped_by, drop_reason,
       consumed_at_step, replay_count, status, finish_reason
FROM {rollouts}
"""

VIEWS: dict[str, str] = {
    "group_stats": _GROUP_STATS,
    "prompt_history": _PROMPT_HISTORY,
    "step_metrics": _STEP_METRICS,
    "lineage": _LINEAGE,
}
"""View name -> SQL template with ``{rollouts}``, ``{steps}`` and ``{half_life}`` slots."""


def view_query(name: str, *, rollouts: str = "lake.rollouts", steps: str = "lake.steps",
               half_life: float = EW_HALF_LIFE) -> str:
    """The SQL of view ``name`` over the given table sources (each usable after FROM)."""
    if name not in VIEWS:
        raise KeyError(f"no view {name!r}; the store has {sorted(VIEWS)}")
    if not half_life > 0:
        raise ValueError(f"half_life must be > 0, got {half_life!r}")
    return VIEWS[name].format(rollouts=rollouts, steps=steps, half_life=float(half_life))


_STORED_TURNS = """
SELECT run_id, step, rollout_id, turn, t.role AS role, t.source AS source,
       len(t.token_ids)::BIGINT AS n_tokens,
       coalesce(len(list_filter(t.mask, lambda x: x)), 0)::BIGINT AS n_loss_tokens,
       t.tool_name AS tool_name,
       t.tool_error AS tool_error, t.reward AS reward,
       CASE WHEN t.logprobs IS NOT NULL THEN coalesce(list_sum(t.logprobs), 0.0) END AS logprob_sum
FROM (SELECT run_id, step, rollout_id, unnest(turns) AS t,
             (generate_subscripts(turns, 1) - 1)::BIGINT AS turn
      FROM {rollouts} WHERE turns IS NOT NULL)
"""

def statements(con: duckdb.DuckDBPyConnection, alias: str = "lake") -> list[str]:
    """``CREATE TEMP VIEW`` statements of every view over the live tables of lake
    ``alias``: first, for a store older than this gfcr, the views that present today's
    tables over it (``store._compat``), then the shipped views and ``turns`` over those."""
    compat = _compat.views(con, _versions.version(con, alias), alias)
    source = {t: (f"temp.main.{t}" if t in compat else f"{alias}.{t}") for t in ("rollouts", "steps")}
    shipped = {name: view_query(name, rollouts=f"{source['rollouts']} AS rollouts",
                                steps=f"{source['steps']} AS steps") for name in VIEWS}
    shipped["turns"] = _STORED_TURNS.format(rollouts=source["rollouts"])
    return [f"CREATE OR REPLACE TEMP VIEW {name} AS {sql}"
            for name, sql in {**compat, **shipped}.items()]


def create_views(con: duckdb.DuckDBPyConnection, alias: str = "lake") -> None:
    """Create every view (:func:`statements`) on connection ``con``."""
    for statement in statements(con, alias):
        con.execute(statement)
