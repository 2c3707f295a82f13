"""What ``gfcr doctor`` reads beyond the report's per-step series: group statistics,
partial credit, score errors and prompt coverage. Read-only queries on an open store."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gfcr.report.data import RunData, aligned, load_run
from gfcr.doctor.turn_facts import gather_turns
from gfcr.rollout import SCORER_FAILED_SQL


@dataclass
class Facts:
    """A run's figures the checks judge; series are aligned with ``run.steps``."""

    run: RunData
    group: dict[str, list[float]] = field(default_factory=dict)
    """Per step over fresh scored groups: ``groups``, ``zero_variance`` (share with one
    reward value), ``identical`` (share whose completions are all the same text; ``identical_wrong``:
    and none of them right),
    ``duplicate`` (mean share of a group's samples that repeat another's)."""
    partial: dict[str, list[float]] = field(default_factory=dict)
    """Per step: ``rewarded_wrong`` (share of rows with 0 < reward < 1) and
    ``wrong_reward_mass`` (their share of all positive reward)."""
    repeated_wrong: list[dict[str, Any]] = field(default_factory=list)
    """Completions paid partial credit on the most distinct prompts."""
    errors: list[dict[str, Any]] = field(default_factory=list)
    """The commonest score errors with their counts."""
    turns: dict[str, Any] = field(default_factory=dict)
    """Multi-turn episodes' figures (gfcr.doctor.turn_facts; zeros for a single-turn run)."""
    prompts: dict[str, Any] = field(default_factory=dict)
    """``sampled``, ``attempted``, ``never_solved`` (attempted >= 2 steps, no success),
    ``draws`` and, where the task can be rebuilt from the stored spec, ``train``."""


def gather(store: Any, run_id: str) -> Facts:
    """The run's data (ReportError for an unknown or empty run) and the doctor's extras."""
    run = load_run(store, run_id, samples=False)
    facts = Facts(run)
    facts.group = aligned(run.steps, store.sql(_GROUPS, [run_id]))
    facts.partial = aligned(run.steps, store.sql(_PARTIAL, [run_id]))
    facts.repeated_wrong = store.sql(_REPEATED_WRONG, [run_id]).to_pylist()
    facts.errors = store.sql(
        "SELECT regexp_replace(score_error, '''[^'']*''', '''…''', 'g') AS error, count(*) AS n, "
        "min(step) AS first_step, max(step) AS last_step FROM rollouts "
        f"WHERE run_id = ? AND {SCORER_FAILED_SQL} GROUP BY 1 ORDER BY n DESC LIMIT 3",
        [run_id]).to_pylist()
    facts.prompts = store.sql(_PROMPTS, [run_id]).to_pylist()[0]
    facts.prompts["train"] = _train_size(store, run_id)
    facts.turns = gather_turns(store, run_id)
    return facts


_GROUPS = """
SELECT step, count(*) AS groups,
       avg((n_rewards = 1)::INT) AS zero_variance,
       avg((n_texts = 1 AND size > 1)::INT) AS identical,
       avg((n_texts = 1 AND size > 1 AND top < 1)::INT) AS identical_wrong,
       avg(1 - n_texts / size) AS duplicate
FROM (SELECT step, group_id, count(*) AS size, count(DISTINCT reward) AS n_rewards,
             count(DISTINCT hash(completion)) AS n_texts, max(reward) AS top
      FROM rollouts WHERE run_id = ? AND replay_count = 0 AND reward IS NOT NULL
        AND status = 'complete'
      GROUP BY step, group_id)
GROUP BY step ORDER BY step
"""

_PARTIAL = """
SELECT step,
       avg((reward > 0 AND reward < 1)::INT) AS rewarded_wrong,
       sum(reward) FILTER (WHERE reward > 0 AND reward < 1) / nullif(sum(reward) FILTER (WHERE reward > 0), 0)
         AS wrong_reward_mass
FROM rollouts WHERE run_id = ? AND reward IS NOT NULL AND replay_count = 0
GROUP BY step ORDER BY step
"""

_REPEATED_WRONG = """
SELECT any_value(completion) AS completion, count(DISTINCT prompt_id) AS prompts,
       count(*) AS rows, avg(reward) AS reward, min(step) AS first_step, max(step) AS last_step
FROM rollouts WHERE run_id = ? AND reward > 0 AND reward < 1 AND replay_count = 0
GROUP BY hash(completion) ORDER BY prompts DESC, rows DESC LIMIT 3
"""

_PROMPTS = """
WITH p AS (
    SELECT prompt_id, count(DISTINCT step) FILTER (WHERE reward IS NOT NULL) AS steps_attempted,
           count_if(reward >= 1) AS successes
    FROM rollouts WHERE run_id = ? AND replay_count = 0 GROUP BY prompt_id)
SELECT count(*) AS sampled, count_if(steps_attempted > 0) AS attempted,
       count_if(steps_attempted >= 2 AND successes = 0) AS never_solved,
       count_if(steps_attempted >= 2) AS attempted_twice,
       sum(steps_attempted) AS draws
FROM p
"""


def _train_size(store: Any, run_id: str) -> int | None:
    """How many training prompts the run's task has, from its stored spec (None when the
    spec's task cannot be rebuilt here, e.g. a plugin that is not installed)."""
    from gfcr.resume import stored_pipeline

    try:
        return int(stored_pipeline(store, run_id).task.train_prompts().num_rows)
    except Exception:  # noqa: BLE001 - any failure only means "unknown"
        return None
