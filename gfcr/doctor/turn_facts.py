"""What ``gfcr doctor`` reads about multi-turn episodes, from the store's ``turns`` view.

An *episode* here is a row whose trajectory is more than one prompt and one policy turn:
a tool turn, more or fewer than one policy turn, or an ``episode_end`` (the column
multi-turn generate stages write, :data:`gfcr.rollout.EPISODE_END`). Single-turn runs have none,
so the checks built on these figures stay silent for them.

- ``episodes``: such rows (complete or not, original ones: ``replay_count = 0``);
- ``tool_rows``: episodes with a tool turn; ``error_loops``: episodes where one tool
  error (same tool, same message) recurs; ``loop_error``: the commonest such error;
- ``format_rows``: episodes with a tool call that did not parse (a ``tool_error`` that
  begins ``FormatError`` or speaks of parsing, JSON or a malformed call);
- ``no_policy_tokens``: episodes with no token in the loss;
- ``ended``: episodes whose ``episode_end`` is known; ``turn_limit``: those the turn
  cap ended;
- ``first_step``, ``last_step``: the step range of the episodes.
"""

from __future__ import annotations

from typing import Any

from gfcr.rollout import EPISODE_END

FORMAT_ERROR_SQL = ("(starts_with(tool_error, 'FormatError') OR "
                    "regexp_matches(tool_error, '(?i)pars|json|malformed'))")
"""A tool error that says the policy's call could not be read (no tool ran)."""

_PER_ROW = """
WITH t AS (SELECT * FROM turns WHERE run_id = $run),
r AS (SELECT rollout_id, step, {end} AS episode_end FROM rollouts
      WHERE run_id = $run AND replay_count = 0),
per_row AS (
    SELECT t.rollout_id, any_value(r.step) AS step, any_value(r.episode_end) AS episode_end,
           count_if(t.source = 'policy') AS policy_turns,
           count_if(t.source = 'tool' OR t.tool_name IS NOT NULL) AS tool_turns,
           count(t.tool_error) - count(DISTINCT coalesce(t.tool_name, '') || chr(0) || t.tool_error)
             AS repeats,
           count_if(t.tool_error IS NOT NULL AND {fmt}) AS format_errors,
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

_LOOP_ERROR = """
SELECT tool_name, tool_error, count(*) AS n FROM turns
WHERE run_id = $run AND tool_error IS NOT NULL
GROUP BY rollout_id, tool_name, tool_error HAVING count(*) > 1
ORDER BY n DESC LIMIT 1
"""


def gather_turns(store: Any, run_id: str) -> dict[str, Any]:
    """The figures of the module docstring for ``run_id`` (zeros for a single-turn run)."""
    columns = set(store.sql("SELECT * FROM rollouts LIMIT 0").column_names)
    end = EPISODE_END if EPISODE_END in columns else "NULL::VARCHAR"
    sql = _PER_ROW.format(end=end, fmt=FORMAT_ERROR_SQL)
    figures: dict[str, Any] = {k: int(v or 0) for k, v in
                               store.sql(sql, {"run": run_id}).to_pylist()[0].items()}
    loop = store.sql(_LOOP_ERROR, {"run": run_id}).to_pylist()
    figures["loop_error"] = loop[0] if loop else None
    return figures
