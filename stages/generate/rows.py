"""Turning engine outputs into rollout rows: shared by every Generate stage."""

from __future__ import annotations

import hashlib
from datetime import datetime, timezone
from typing import Any

import pyarrow as pa

from gfcr.engine import Engine, GenOutput
from gfcr.rollout import ROLLOUT_SCHEMA, col
from gfcr.stage import StepContext

STATUS_OF = {"stop": "complete", "length": "complete", "aborted": "partial",
             "pruned": "pruned"}


def stable_id(*parts: Any) -> str:
    """Deterministic id from its parts, so every executor names rows the same."""
    return hashlib.sha256("\x00".join(map(str, parts)).encode()).hexdigest()[:16]


def rollout_row(ctx: StepContext, prompt: dict[str, Any], group_id: str, sample_idx: int,
                prompt_ids: list[int], out: GenOutput, engine: Engine,
                parent_id: str | None = None) -> dict[str, Any]:
    """One rollout row in ROLLOUT_SCHEMA from a prompt row and an engine output."""
    return {
        col.RUN_ID: ctx.run_id, col.STEP: ctx.step,
        col.ROLLOUT_ID: stable_id(ctx.run_id, ctx.step, group_id, sample_idx),
        col.PROMPT_ID: prompt[col.PROMPT_ID], col.GROUP_ID: group_id,
        col.SAMPLE_IDX: sample_idx, col.PARENT_ID: parent_id,
        col.TASK: prompt[col.TASK], col.PROMPT: prompt[col.PROMPT],
        col.ANSWER: prompt.get(col.ANSWER), col.META: prompt.get(col.META),
        col.COMPLETION: engine.decode(out.completion_ids),
        col.PROMPT_IDS: prompt_ids, col.COMPLETION_IDS: out.completion_ids,
        col.LOGPROBS: out.logprobs,
        col.POLICY_VERSION_START: out.version_start, col.POLICY_VERSION_END: out.version_end,
        col.FINISH_REASON: out.finish_reason, col.STATUS: STATUS_OF[out.finish_reason],
        col.REWARD: None, col.REWARDS: None, col.SCORE_ERROR: None, col.ADVANTAGE: None,
        col.KEPT: True, col.DROPPED_BY: None, col.DROP_REASON: None,
        col.CONSUMED_AT_STEP: None, col.REPLAY_COUNT: 0,
        col.N_TOKENS: len(out.completion_ids), col.GEN_SECONDS: out.seconds,
        col.CREATED_AT: datetime.now(timezone.utc),
    }


def to_table(rows: list[dict[str, Any]]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=ROLLOUT_SCHEMA)
