"""The per-run views the report, the doctor, ``gfcr runs`` and resume read: named SQL
over ``rollouts`` and ``steps``, declared once here, store-side.

Each is a query with one bound parameter, ``$run`` (the run id), that aggregates in
DuckDB, so a run of a million rollouts is read in seconds and only the aggregates leave
the database. gfcr reaches them by name through ``StoreBackend.reads`` (the ``RunReads``
protocol in gfcr.core.storage; ``store.reads`` implements it) and holds no SQL itself.

- ``report_steps``: per step, the row count, kept share, length mean and p95, truncated
  share, reward and pass rate of fresh (original) rows, scorer-failure and timeout
  shares, replayed share, staleness (the step's newest ``policy_version_end`` minus a
  row's ``policy_version_start``) over kept rows, and the fresh rows' NLL per token with
  its standard error.
- ``drops``: rows the filters dropped, per step, stage and reason.
- ``pass_bins``: per step, how many fresh scored groups fall in each pass-rate bin
  (share of a group's samples with reward >= 1: 0, (0, .25], (.25, .5], (.5, .75],
  (.75, 1), 1 as bins 0-5).
- ``group_facts``: per step over fresh, complete, scored groups: their count, the share
  with one reward value, with identical completions (and none right), and the mean
  share of duplicated samples.
- ``partial_credit``: per step, the share of rows paid 0 < reward < 1 and their share of
  all positive reward.
- ``repeated_wrong``: the three completions paid partial credit on the most prompts.
- ``score_errors``: the three commonest scorer failures (quoted values masked).
- ``prompt_coverage``: prompts sampled, attempted, attempted twice and never solved, and
  the draws (steps attempted, summed over prompts).
- ``turn_figures``: per number of policy turns in an episode (fresh rows), the episodes,
  their success share (reward >= 1) and the policy's own tokens (the ``turns`` view).

Two reads of multi-turn episodes depend on a column only multi-turn stages write
(``episode_end``), so they are templates the reads fill (``store.reads``):
:data:`EPISODE_FIGURES` (the doctor's agentic figures, gfcr.doctor.checks_agentic) and
:data:`LOOP_ERROR`; :data:`CHAT_PICKS` picks the report's sample trajectories.
"""

from __future__ import annotations

from gfcr.core.rollout import SCORER_FAILED_SQL

_REPORT_STEPS = """
SELECT step,
       count(*) AS rows,
       avg(kept::INT) AS kept_share,
       avg(n_tokens) AS length_mean,
       quantile_cont(n_tokens, 0.95) AS length_p95,
       avg((finish_reason = 'length')::INT) AS truncated_share,
       avg(reward) FILTER (WHERE fresh) AS sampled_reward,
       avg((reward >= 1)::INT) FILTER (WHERE fresh AND reward IS NOT NULL) AS sampled_pass_rate,
       avg(""" + SCORER_FAILED_SQL + """::INT) AS score_error_share,
       avg(coalesce(score_error ILIKE '%timeout%', false)::INT) AS score_timeout_share,
       avg((NOT fresh)::INT) AS replayed_share,
       avg(stale::DOUBLE) FILTER (WHERE kept AND stale > 0) AS staleness_mean,
       max(stale) FILTER (WHERE kept) AS staleness_max,
       avg((stale > 0)::INT) FILTER (WHERE kept) AS offpolicy_row_share,
       -sum(list_sum(logprobs)) FILTER (WHERE fresh AND n_tokens > 0)
         / nullif(sum(n_tokens) FILTER (WHERE fresh AND n_tokens > 0), 0) AS sampled_nll,
       sqrt(var_samp(-list_sum(logprobs) / n_tokens) FILTER (WHERE fresh AND n_tokens > 0)
            / count(*) FILTER (WHERE fresh AND n_tokens > 0)) AS sampled_nll_se
FROM (SELECT r.*, replay_count = 0 AS fresh, v.newest - policy_version_start AS stale
      FROM rollouts r JOIN (
          SELECT step, coalesce(max(policy_version_end) FILTER (WHERE replay_count = 0),
                                max(policy_version_end)) AS newest
          FROM rollouts WHERE run_id = $run GROUP BY step) v USING (step)
      WHERE r.run_id = $run)
GROUP BY step ORDER BY step
"""

_DROPS = """
SELECT step, dropped_by, coalesce(drop_reason, '?') AS reason, count(*) AS n
FROM rollouts WHERE run_id = $run AND NOT kept GROUP BY ALL
"""

_PASS_BINS = """
SELECT step,
       CASE WHEN pass_rate = 0 THEN 0 WHEN pass_rate <= 0.25 THEN 1 WHEN pass_rate <= 0.5 THEN 2
            WHEN pass_rate <= 0.75 THEN 3 WHEN pass_rate < 1 THEN 4 ELSE 5 END AS bin,
       count(*) AS n
FROM (SELECT step, group_id, avg((reward >= 1)::INT) AS pass_rate FROM rollouts
      WHERE run_id = $run AND reward IS NOT NULL AND replay_count = 0 GROUP BY step, group_id)
GROUP BY ALL
"""

_GROUP_FACTS = """
SELECT step, count(*) AS groups,
       avg((n_rewards = 1)::INT) AS zero_variance,
       avg((n_texts = 1 AND size > 1)::INT) AS identical,
       avg((n_texts = 1 AND size > 1 AND top < 1)::INT) AS identical_wrong,
       avg(1 - n_texts / size) AS duplicate
FROM (SELECT step, group_id, count(*) AS size, count(DISTINCT reward) AS n_rewards,
             count(DISTINCT hash(completion)) AS n_texts, max(reward) AS top
      FROM rollouts WHERE run_id = $run AND replay_count = 0 AND reward IS NOT NULL
        AND status = 'complete'
      GROUP BY step, group_id)
GROUP BY step ORDER BY step
"""

_PARTIAL_CREDIT = """
SELECT step,
       avg((reward > 0 AND reward < 1)::INT) AS rewarded_wrong,
       sum(reward) FILTER (WHERE reward > 0 AND reward < 1) / nullif(sum(reward) FILTER (WHERE reward > 0), 0)
         AS wrong_reward_mass
FROM rollouts WHERE run_id = $run AND reward IS NOT NULL AND replay_count = 0
GROUP BY step ORDER BY step
"""

_REPEATED_WRONG = """
SELECT any_value(completion) AS completion, count(DISTINCT prompt_id) AS prompts,
       count(*) AS rows, avg(reward) AS reward, min(step) AS first_step, max(step) AS last_step
FROM rollouts WHERE run_id = $run AND reward > 0 AND reward < 1 AND replay_count = 0
GROUP BY hash(completion) ORDER BY prompts DESC, rows DESC LIMIT 3
"""

_SCORE_ERRORS = ("SELECT regexp_replace(score_error, '''[^'']*''', '''…''', 'g') AS error, count(*) AS n, "
                 "min(step) AS first_step, max(step) AS last_step FROM rollouts "
                 f"WHERE run_id = $run AND {SCORER_FAILED_SQL} GROUP BY 1 ORDER BY n DESC LIMIT 3")

_PROMPT_COVERAGE = """
WITH p AS (
    SELECT prompt_id, count(DISTINCT step) FILTER (WHERE reward IS NOT NULL) AS steps_attempted,
           count_if(reward >= 1) AS successes
    FROM rollouts WHERE run_id = $run AND replay_count = 0 GROUP BY prompt_id)
SELECT count(*) AS sampled, count_if(steps_attempted > 0) AS attempted,
       count_if(steps_attempted >= 2 AND successes = 0) AS never_solved,
       count_if(steps_attempted >= 2) AS attempted_twice,
       sum(steps_attempted) AS draws
FROM p
"""

FORMAT_ERROR_SQL = ("(starts_with(tool_error, 'FormatError') OR "
                    "regexp_matches(tool_error, '(?i)pars|json|malformed'))")
"""A tool error that says the policy's call could not be read (no tool ran)."""

EPISODE_FIGURES = """
WITH t AS (SELECT * FROM turns WHERE run_id = $run),
r AS (SELECT rollout_id, step, {end} AS episode_end FROM rollouts
      WHERE run_id = $run AND replay_count = 0),
per_row AS (
    SELECT t.rollout_id, any_value(r.step) AS step, any_value(r.episode_end) AS episode_end,
           count_if(t.source = 'policy') AS policy_turns,
           count_if(t.source = 'tool' OR t.tool_name IS NOT NULL) AS tool_turns,
           count(t.tool_error) - count(DISTINCT coalesce(t.tool_name, '') || chr(0) || t.tool_error)
             AS repeats,
           count_if(t.tool_error IS NOT NULL AND """ + FORMAT_ERROR_SQL + """) AS format_errors,
           sum(CASE WHEN t.source = 'policy' THEN t.n_loss_tokens ELSE 0 END) AS loss_tokens
    FROM t JOIN r USING (rollout_id) GROUP BY t.rollout_id),
ep AS (SELECT * FROM per_row
       WHERE tool_turns > 0 OR policy_turns <> 1 OR episode_end IS NOT NULL)
SELECT count(*) AS episodes, count_if(tool_turns > 0) AS tool_rows,
       count_if(repeats > 0) AS error_loops, count_if(format_errors > 0) AS format_rows,
       count_if(loss_tokens = 0) AS no_policy_tokens,
       count(episode_end) AS ended, count_if(episode_end = 'turn_limit') AS turn_limit,
       min(step) AS first_step, max(step) AS last_step
FROM ep
"""
"""One row of multi-turn figures; ``{end}``: the ``episode_end`` column, or a null."""

LOOP_ERROR = """
SELECT tool_name, tool_error, count(*) AS n FROM turns
WHERE run_id = $run AND tool_error IS NOT NULL
GROUP BY rollout_id, tool_name, tool_error HAVING count(*) > 1
ORDER BY n DESC LIMIT 1
"""

CHAT_PICKS = """
WITH m AS (
    SELECT rollout_id, step, reward, turns,
           CASE WHEN len(list_filter(turns, lambda t: t.tool_error IS NOT NULL)) > 0 THEN 'tool error'
                WHEN reward >= 1 THEN 'right' WHEN reward IS NOT NULL THEN 'wrong'
                ELSE 'unscored' END AS kind
    FROM rollouts WHERE run_id = $run AND turns IS NOT NULL
      AND (len(turns) > 3 OR len(list_filter(turns, lambda t: t.source = 'tool')) > 0))
SELECT arg_max(rollout_id, step * 1e9 - (hash(rollout_id) % 1000000)::DOUBLE) AS rollout_id, kind
FROM m GROUP BY kind ORDER BY kind LIMIT $n
"""
"""One multi-turn row per kind (right, wrong, tool error, unscored), each the latest."""

_TURN_FIGURES = """
WITH t AS (SELECT rollout_id, count_if(source = 'policy') AS policy_turns,
                  sum(CASE WHEN source = 'policy' THEN n_tokens ELSE 0 END) AS policy_tokens
           FROM turns WHERE run_id = $run GROUP BY rollout_id),
r AS (SELECT rollout_id, reward FROM rollouts WHERE run_id = $run AND replay_count = 0)
SELECT policy_turns, count(*) AS episodes, avg((reward >= 1)::INT) AS success,
       sum(policy_tokens)::BIGINT AS policy_tokens
FROM t JOIN r USING (rollout_id) GROUP BY policy_turns ORDER BY policy_turns
"""

RUN_VIEWS: dict[str, str] = {
    "report_steps": _REPORT_STEPS,
    "drops": _DROPS,
    "pass_bins": _PASS_BINS,
    "group_facts": _GROUP_FACTS,
    "partial_credit": _PARTIAL_CREDIT,
    "repeated_wrong": _REPEATED_WRONG,
    "score_errors": _SCORE_ERRORS,
    "prompt_coverage": _PROMPT_COVERAGE,
    "turn_figures": _TURN_FIGURES,
}
"""Per-run view name -> its SQL (one parameter, ``$run``)."""
