"""Hand-built rollout tables for filter tests: give the columns that matter, get a table
in ROLLOUT_SCHEMA with every other column filled with a plausible default."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import pyarrow as pa

from gfcr.core.rollout import ROLLOUT_SCHEMA, col
from gfcr.core.stage import StepContext


def rollouts(groups: list[str], reward: list[float | None] | None = None, **columns: Any
             ) -> pa.Table:
    """One row per entry of ``groups``; ``columns`` maps a column name to its values.
    Columns outside the schema are appended as extra columns."""
    n = len(groups)
    completions = columns.pop(col.COMPLETION, ["x"] * n)
    base: dict[str, list[Any]] = {
        col.RUN_ID: ["run"] * n, col.STEP: [0] * n,
        col.ROLLOUT_ID: [f"r{i}" for i in range(n)],
        col.PROMPT_ID: [f"p-{g}" for g in groups], col.GROUP_ID: list(groups),
        col.SAMPLE_IDX: list(range(n)), col.PARENT_ID: [None] * n, col.TASK: ["t"] * n,
        col.PROMPT: [f"prompt {g}" for g in groups], col.ANSWER: ["42"] * n,
        col.META: [None] * n, col.COMPLETION: completions,
        col.PROMPT_IDS: [[1, 2]] * n, col.COMPLETION_IDS: [[3] * len(c) for c in completions],
        col.LOGPROBS: [[-0.5] * len(c) for c in completions],
        col.POLICY_VERSION_START: [0] * n, col.POLICY_VERSION_END: [0] * n,
        col.FINISH_REASON: ["stop"] * n, col.STATUS: ["complete"] * n,
        col.REWARD: reward if reward is not None else [None] * n,
        col.REWARDS: [None] * n, col.SCORE_ERROR: [None] * n, col.ADVANTAGE: [None] * n,
        col.KEPT: [True] * n, col.DROPPED_BY: [None] * n, col.DROP_REASON: [None] * n,
        col.CONSUMED_AT_STEP: [None] * n, col.REPLAY_COUNT: [0] * n,
        col.N_TOKENS: [len(c) for c in completions], col.GEN_SECONDS: [0.1] * n,
        col.CREATED_AT: [datetime(2025, 1, 1, tzinfo=timezone.utc)] * n,
        col.TURNS: [None] * n,
    }
    extra = {k: v for k, v in columns.items() if k not in base}
    base.update({k: v for k, v in columns.items() if k in base})
    table = pa.table({f.name: pa.array(base[f.name], f.type) for f in ROLLOUT_SCHEMA},
                     schema=ROLLOUT_SCHEMA)
    for name, values in extra.items():
        table = table.append_column(name, pa.array(values))
    return table


def context(step: int = 0, task: Any = None, history: Any = None, seed: int = 0) -> StepContext:
    """A step context for calling a stage directly."""
    return StepContext(run_id="run", step=step, seed=seed, policy_version=0, task=task,
                       history=history)


def kept_after(stage: Any, table: pa.Table, ctx: StepContext | None = None) -> list[bool]:
    """The keep mask ``stage.apply`` returns (all True when it returns none)."""
    result = stage.apply(ctx or context(), table)
    return [True] * table.num_rows if result.keep is None else list(result.keep)
