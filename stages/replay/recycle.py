"""Recycling of partial rollouts (APRIL; Zhou et al. 2025, "APRIL: Active Partial Rollouts
in Reinforcement Learning to Tame Long-tail Generation").

The store is the buffer. A step that stops rollouts early (``ActivePartialRollouts``)
commits the stopped ones, and the finished samples of their groups, with status
``partial``; a partial row that no later row names as its ``parent_id`` is *pending*.
:class:`RecyclePartials` reads the pending rows of the run from ``ctx.history`` — the
store as of the previous step — and puts their groups first in the step's plan, where
the generate stage continues each sample from its stored token ids and logprobs. So a
run stopped and resumed recycles exactly the partials it left, since nothing lives in
memory (OpenRLHF #1322 lost its buffer on resume).

Lineage: every recycled row points to the stored row it came from through ``parent_id``
and keeps the group id and the ``policy_version_start`` of the original; its
``completion_ids`` and ``logprobs`` are the parent's followed by the new tokens, so the
two stay the same length (slime #2207). A group older than ``max_staleness`` policy
versions is restarted from scratch instead: new samples, ``parent_id`` still set, a fresh
``policy_version_start`` — which is how :func:`recycle_counts` tells restarts apart.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field

from gfcr.core import storage
from gfcr.core.capabilities import ContinuesPartials
from gfcr.core.rollout import PROMPT_COLUMNS, PROMPT_SCHEMA, col
from gfcr.core.rollout import EXEMPLARS, HINT_TOKENS, RECYCLE, RECYCLE_TYPE
from gfcr.core.row_filter import ASCENDING, RowFilter
from gfcr.core.stage import StageSpec, StepContext
from gfcr.core.registry import register
from gfcr.core.storage import History

PLAN_SCHEMA = pa.schema(list(PROMPT_SCHEMA) + [
    pa.field(col.GROUP_ID, pa.string()), pa.field("n", pa.int64()),
    pa.field(RECYCLE, RECYCLE_TYPE)])
"""What RecyclePartials returns: prompt columns plus the recycled group's id, size and
samples (all null on rows of fresh prompts)."""


@register("replay")
class RecyclePartials(StageSpec):
    """Put the run's pending partial groups first in the step's plan (APRIL's buffer).

    Departures from APRIL/slime: the buffer is a query over the store, not process memory;
    a group is recycled whole (finished samples are carried over, not regenerated) and a
    group staler than ``max_staleness`` policy versions is restarted rather than trained
    off-policy. Refill rounds of a step recycle nothing (the step's partials were taken in
    round 0). The generate stage must continue what the ``recycle`` plan column holds
    (``GroupSample`` and ``ConditionedSample`` do; the pipeline refuses one that does not
    declare ``continues_partials``, e.g. ``TreeRollout``). Put it before the fresh-prompt
    sampler, whose batch it fills first.

    >>> RecyclePartials(max_staleness=2)
    RecyclePartials(name=None, type='recycle_partials', max_staleness=2)
    """

    type: Literal["recycle_partials"] = "recycle_partials"
    engine_needs: ClassVar[frozenset[str]] = frozenset({"continuation"})
    max_staleness: int = Field(4, ge=0)
    """Policy versions a group may lag (current minus its first token's) and still be
    continued; older groups are restarted from scratch."""

    writes: ClassVar[frozenset[str]] = PROMPT_COLUMNS | {col.GROUP_ID, "n", RECYCLE}

    def check_pipeline(self, stages: tuple[StageSpec, ...]) -> list[str]:
        """The generate stage must continue the groups this stage brings back."""
        gens = [s for s in stages if s.kind == "generate"
                and not (isinstance(s, ContinuesPartials) and s.continues_partials)]
        return [f"stages {self.label!r} and {s.label!r}: {self.label!r} puts pending partial "
                f"rollouts in the plan's {RECYCLE!r} column to be continued, but generate "
                f"stage {s.label!r} ({type(s).__name__}) does not continue partial rollouts "
                "(continues_partials is not set), so they would be picked again every step "
                "and never finished; use a generate stage that continues them (GroupSample, "
                f"ConditionedSample), or remove {self.label!r} and the stage that stops rollouts"
                for s in gens]

    def select(self, ctx: StepContext, chosen: pa.Table) -> pa.Table:
        chosen = with_plan_columns(chosen)
        if ctx.round:
            return chosen
        if ctx.history is None:
            if ctx.step == 0:
                return chosen
            raise ValueError(f"stage {self.label!r}: step {ctx.step!r} has no store history "
                             "(ctx.history is None), so partial rollouts cannot be found; "
                             "run the pipeline with a store")
        pending = pending_partials(ctx.history, ctx.run_id)
        plan = recycled_plan(pending.to_pylist(), ctx.policy_version, self.max_staleness)
        return pa.concat_tables([plan, chosen], promote_options="permissive")


def with_plan_columns(table: pa.Table) -> pa.Table:
    """``table`` with PLAN_SCHEMA's extra columns (nulls where missing), in its order."""
    for f in PLAN_SCHEMA:
        if f.name not in table.column_names:
            table = table.append_column(f, pa.nulls(table.num_rows, f.type))
    return table.select(PLAN_SCHEMA.names + [n for n in table.column_names
                                             if n not in PLAN_SCHEMA.names])


def pending_partials(history: History, run_id: str) -> pa.Table:
    """Partial rows of ``run_id`` that no row continues yet, as of the history's snapshot,
    oldest step first, with every column the store has: extra ones (``hint_tokens``, ...)
    exist only where a stage wrote them."""
    order = ((col.STEP, ASCENDING), (col.GROUP_ID, ASCENDING), (col.SAMPLE_IDX, ASCENDING))
    partial = history.rows(RowFilter(run_ids=(run_id,), status=("partial",)), order_by=order)
    if partial.num_rows == 0:
        return partial
    ids = partial.column(col.ROLLOUT_ID)
    continued = history.rows(RowFilter(run_ids=(run_id,), parent_ids=tuple(ids.to_pylist())),
                             columns=[col.PARENT_ID]).column(col.PARENT_ID)
    return partial.filter(pc.invert(pc.is_in(ids, value_set=continued.combine_chunks())))


def recycled_plan(rows: list[dict[str, Any]], version: int, max_staleness: int) -> pa.Table:
    """One plan row per pending group (in the order of ``rows``): continue, carry over or,
    past ``max_staleness``, restart each of its samples."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault(r[col.GROUP_ID], []).append(r)
    plan = []
    for group_id, members in groups.items():
        oldest = min(m[col.POLICY_VERSION_START] for m in members)
        restart = version - oldest > max_staleness
        first = members[0]
        plan.append({**{c: first[c] for c in PROMPT_SCHEMA.names}, col.GROUP_ID: group_id,
                     "n": len(members), RECYCLE: [_sample(m, restart) for m in members]})
    return pa.Table.from_pylist(plan, schema=PLAN_SCHEMA)


def _sample(row: dict[str, Any], restart: bool) -> dict[str, Any]:
    """What to do with one stored partial row (see stages.generate.rows.RECYCLE_TYPE)."""
    finished = row[col.FINISH_REASON] in ("stop", "length")
    if restart:
        return {"sample_idx": row[col.SAMPLE_IDX], "parent_id": row[col.ROLLOUT_ID],
                "prefix_ids": [], "prefix_logprobs": [], "policy_version_start": None,
                "policy_version_end": None, "finish_reason": None,
                "hint_tokens": None, "exemplars": row.get(EXEMPLARS)}
    return {"sample_idx": row[col.SAMPLE_IDX], "parent_id": row[col.ROLLOUT_ID],
            "prefix_ids": row[col.COMPLETION_IDS], "prefix_logprobs": row[col.LOGPROBS],
            "policy_version_start": row[col.POLICY_VERSION_START],
            "policy_version_end": row[col.POLICY_VERSION_END],
            "finish_reason": row[col.FINISH_REASON] if finished else None,
            "hint_tokens": row.get(HINT_TOKENS), "exemplars": row.get(EXEMPLARS)}


def recycle_counts(store: Any, run_id: str) -> dict[str, int]:
    """How the run's partial rows were used: ``continued`` (an aborted sample extended),
    ``carried`` (a finished sibling carried over), ``restarted`` (past the staleness bound:
    the child's first policy version differs from its parent's), ``pending`` (not used
    yet), and ``discarded`` (pruned rows: generated, then dropped on purpose)."""
    names = [col.ROLLOUT_ID, col.PARENT_ID, col.STATUS, col.FINISH_REASON, col.POLICY_VERSION_START]
    rows = storage.backend().history(store, run_id).rows(RowFilter(run_ids=(run_id,)), columns=names)
    status = rows.column(col.STATUS)
    partial = {r[col.ROLLOUT_ID]: r for r in rows.filter(pc.equal(status, "partial")).to_pylist()}
    children = rows.filter(pc.is_in(rows.column(col.PARENT_ID), value_set=pa.array(list(partial), pa.string())))
    counts = dict.fromkeys(("continued", "carried", "restarted", "pending", "discarded"), 0)
    for child in children.to_pylist():
        parent = partial[child[col.PARENT_ID]]
        if child[col.POLICY_VERSION_START] != parent[col.POLICY_VERSION_START]:
            counts["restarted"] += 1
        elif parent[col.FINISH_REASON] == "aborted":
            counts["continued"] += 1
        elif parent[col.FINISH_REASON] is not None:
            counts["carried"] += 1
    counts["pending"] = len(set(partial) - set(children.column(col.PARENT_ID).to_pylist()))
    counts["discarded"] = int(pc.sum(pc.equal(status, "pruned")).as_py() or 0)
    return counts
