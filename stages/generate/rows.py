"""Turning engine outputs into rollout rows: shared by every Generate stage.

Also the plan's ``recycle`` column, the contract between a Replay stage that brings back
unfinished groups (``stages.replay.recycle.RecyclePartials``) and a Generate stage that
continues them, and the rule that a group is trained whole (:func:`hold_unfinished_groups`).
A generate stage that honours the column declares ``continues_partials = True``
(:data:`CONTINUES_PARTIALS`); the pipeline refuses a recycling stage beside one that
does not, since its pending partials would be picked again every step, never continued.
"""

from __future__ import annotations

from datetime import datetime, timezone
from dataclasses import replace
from typing import Any

import pyarrow as pa

from gfcr.core.engine import Engine, GenOutput
from gfcr.core.rollout import (NEW_TOKENS, RECYCLE, RECYCLE_TYPE, ROLLOUT_SCHEMA, SERVER,  # noqa: F401
                               col, stable_id)
from gfcr.core.stage import StepContext

CONTINUES_PARTIALS = "continues_partials"
"""Name of the ClassVar (bool) by which a generate stage says it honours ``recycle``."""

GENERATED_SCHEMA = pa.schema(list(ROLLOUT_SCHEMA) + [pa.field(NEW_TOKENS, pa.int32())])
"""What :func:`to_table` returns: the rollout schema and :data:`gfcr.core.rollout.NEW_TOKENS`."""

STATUS_OF = {"stop": "complete", "length": "complete", "aborted": "partial",
             "pruned": "pruned"}


def rollout_row(ctx: StepContext, prompt: dict[str, Any], group_id: str, sample_idx: int,
                prompt_ids: list[int], out: GenOutput, engine: Engine,
                parent_id: str | None = None, prefix_tokens: int = 0) -> dict[str, Any]:
    """One rollout row in ROLLOUT_SCHEMA from a prompt row and an engine output, with
    ``new_tokens``: the completion minus its first ``prefix_tokens``, which were not
    generated in this step (a continued or carried prefix, a shared branch, a hint)."""
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
        NEW_TOKENS: len(out.completion_ids) - prefix_tokens,
        **({SERVER: out.server} if out.server is not None else {}),
    }


def to_table(rows: list[dict[str, Any]], schema: pa.Schema = GENERATED_SCHEMA) -> pa.Table:
    """Rows of :func:`rollout_row` as a table in ``schema`` (a generate stage's: by default
    :data:`GENERATED_SCHEMA`), with the ``server`` column when a fleet generated any of
    them (gfcr.core.rollout.SERVER)."""
    if any(SERVER in r for r in rows):
        schema = schema.append(pa.field(SERVER, pa.string()))
    return pa.Table.from_pylist(rows, schema=schema)


def plan_samples(prompt: dict[str, Any], default_n: int) -> list[dict[str, Any]]:
    """The samples a plan row asks for: its ``recycle`` structs, or ``n`` fresh ones."""
    recycled = prompt.get(RECYCLE)
    if recycled is not None:
        return sorted(recycled, key=lambda s: s["sample_idx"])
    n = default_n if prompt.get("n") is None else int(prompt["n"])
    return [{"sample_idx": i, "parent_id": None, "prefix_ids": [], "prefix_logprobs": [],
             "policy_version_start": None, "policy_version_end": None, "finish_reason": None,
             "hint_tokens": None, "exemplars": None} for i in range(n)]


def carried_output(sample: dict[str, Any]) -> GenOutput:
    """A finished sample carried over unchanged (no tokens generated, versions kept)."""
    return GenOutput(key=-1, completion_ids=list(sample["prefix_ids"]),
                     logprobs=list(sample["prefix_logprobs"]),
                     finish_reason=sample["finish_reason"],
                     version_start=sample["policy_version_start"],
                     version_end=sample["policy_version_end"], seconds=0.0)


def continued_output(out: GenOutput, sample: dict[str, Any]) -> GenOutput:
    """A continuation keeps the policy version of its first token (the original's)."""
    start = sample.get("policy_version_start")
    return out if start is None else replace(out, version_start=int(start))


def hold_unfinished_groups(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A group is trained whole: when any sample of a group was stopped (partial), its
    finished samples are held as partial too (their ``finish_reason`` is kept), to be
    carried over when the group is continued. Pruned samples do not hold a group.

    This is how APRIL and slime recycle an unfinished group (Zhou et al. 2025): the group
    advantage is then computed over all of its samples, never over the early finishers.
    """
    held = {r[col.GROUP_ID] for r in rows if r[col.STATUS] == "partial"}
    for r in rows:
        if r[col.GROUP_ID] in held and r[col.STATUS] == "complete":
            r[col.STATUS] = "partial"
    return rows
