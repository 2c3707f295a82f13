"""Per-step tool figures of multi-turn episodes: how often the policy calls a tool, how
often a call fails, and how often an episode succeeds.

An agent learning a tool is read off three numbers per step (rStar2-Agent and
Fission-GRPO report the same ones, Shang et al. 2025): the **tool-call rate** (share of
the step's fresh episodes with at least one tool call), the **tool-error rate** (share
of those calls that failed: did not parse, named an unknown tool, raised, hit a limit)
and **success** (share of fresh episodes with reward >= 1). They go into the step's
metrics (the store's ``steps`` table, MLflow) as ``tool/call_rate``,
``tool/error_rate``, ``tool/calls`` and ``tool/success``, and the report charts them.

A call is a turn with a ``tool_name`` in the ``turns`` column (gfcr.core.trajectory:
Episodes puts the tool's output turn there, with its ``tool_error``). An agent's
episode (AgentEnv) records the calls the endpoint parsed but not whether running them
failed, nor a call too malformed to parse: an agent says so in its reward components
(``rewards`` column) ``tool_calls`` and ``tool_errors``, which count where larger.
Only steps of multi-turn stages (rows with ``episode_end``) get these figures.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from gfcr.core.rollout import EPISODE_END, col


def tool_metrics(table: pa.Table) -> dict[str, float]:
    """``tool/*`` figures of the step's fresh multi-turn rows (none for other steps); a
    table without ``replay_count`` (a generate stage's own output) is all fresh."""
    if EPISODE_END not in table.column_names or "turns" not in table.column_names:
        return {}
    names = [c for c in ("turns", col.REWARD, col.REPLAY_COUNT, col.REWARDS)
             if c in table.column_names]
    rows = [r for r in table.select(names).to_pylist() if not r.get(col.REPLAY_COUNT)]
    if not rows:
        return {}
    calls = [_calls(r) for r in rows]
    n_calls = sum(c for c, _ in calls)
    return {"tool/call_rate": sum(c > 0 for c, _ in calls) / len(rows),
            "tool/error_rate": sum(e for _, e in calls) / n_calls if n_calls else 0.0,
            "tool/calls": float(n_calls),
            "tool/success": sum((r.get(col.REWARD) or 0.0) >= 1.0 for r in rows) / len(rows)}


def _calls(row: dict[str, Any]) -> tuple[int, int]:
    """(tool calls, failed calls) of one row: its turns', or its agent's count if larger."""
    turns = [t for t in row["turns"] or [] if t.get("tool_name")]
    calls, errors = len(turns), sum(1 for t in turns if t.get("tool_error"))
    said = dict(row.get(col.REWARDS) or [])
    calls = max(calls, int(said.get("tool_calls") or 0))
    return calls, min(calls, max(errors, int(said.get("tool_errors") or 0)))
