"""Replayed copies of stored rollouts, and appending them to a step's batch.

A replayed row is a new row of the current (run, step): new ``rollout_id`` and
``group_id`` (stable hashes, so every executor and a resumed run name it the same),
``parent_id`` the rollout it copies, ``replay_count`` one more than the replays of that
rollout so far. It keeps what the behaviour policy produced — token ids, ``logprobs``,
``policy_version_start``/``_end``, reward and scores, ``created_at`` — so the trainer's
off-policy correction sees the true behaviour policy; training columns are reset, and
``gen_seconds`` is 0 because nothing was generated for it this step.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from gfcr.core.rollout import col, conform
from gfcr.core.rollout import stable_id
from gfcr.core.stage import StepContext


def copies(ctx: StepContext, rows: pa.Table, replays: Sequence[int], *, tag: str,
           extra: dict[str, Sequence[object]] | None = None) -> pa.Table:
    """Replayed copies of ``rows`` (ROLLOUT_SCHEMA) for this step.

    ``replays[i]`` is the ``replay_count`` of copy i; ``tag`` keeps the ids of different
    replay stages apart; ``extra`` adds declared extra columns (name -> values).
    """
    n = rows.num_rows
    originals = rows.column(col.ROLLOUT_ID).to_pylist()
    sources = rows.column(col.RUN_ID).to_pylist()
    groups = rows.column(col.GROUP_ID).to_pylist()
    values = {
        col.RUN_ID: [ctx.run_id] * n,
        col.STEP: [ctx.step] * n,
        col.ROLLOUT_ID: [stable_id(ctx.run_id, ctx.step, ctx.round, tag, s, r)
                         for s, r in zip(sources, originals)],
        col.GROUP_ID: [stable_id(ctx.run_id, ctx.step, ctx.round, tag, s, g)
                       for s, g in zip(sources, groups)],
        col.PARENT_ID: originals,
        col.REPLAY_COUNT: list(replays),
        col.ADVANTAGE: [None] * n,
        col.CONSUMED_AT_STEP: [None] * n,
        col.KEPT: [True] * n,
        col.DROPPED_BY: [None] * n,
        col.DROP_REASON: [None] * n,
        col.GEN_SECONDS: [0.0] * n,
    }
    table = rows
    for name, column in values.items():
        i = table.schema.get_field_index(name)
        table = table.set_column(i, table.schema.field(i), pa.array(column, table.schema.field(i).type))
    for name, column in (extra or {}).items():
        table = table.append_column(name, pa.array(list(column), pa.string()))
    return table


def append(batch: pa.Table, replayed: pa.Table) -> pa.Table:
    """``batch`` followed by ``replayed``; a column only one side has is null on the other."""
    if replayed.num_rows == 0:
        return batch
    return conform(pa.concat_tables([batch, replayed], promote_options="permissive"),
                   where="batch with replayed rollouts")
