"""Rollout Replay: fill part of each training batch with the run's recent rollouts.

The RR half of DOTS+RR ("Improving Data Efficiency for LLM
Reinforcement Fine-tuning Through Difficulty-targeted Online Data Selection and Rollout
Replay"): new rollouts are generated for only part of each batch and the rest is drawn
from a FIFO buffer of recent rollouts, trained on with an off-policy (importance-
weighted, clipped) GRPO loss. Here there is no buffer to lose on a crash: the buffer is
a query over the store — the run's kept, trained, original rollouts of the last
``window`` steps, newest first — read as of the previous step, so a resumed run replays
exactly what the original run replayed (OpenRLHF #1322 is the failure this avoids).

A replayed row keeps its behaviour ``logprobs`` and policy versions (so the train
stage's ratio is taken against the policy that generated it) and is committed again as
a new row with ``parent_id`` the original and ``replay_count`` one more than the
original's replays so far (:mod:`stages.replay._copies`). The loop's step metrics
report ``replay/rows``, ``replay/share`` and ``replay/staleness_*`` to MLflow.

Departure: whole groups are replayed (GRPO's advantage needs the group), and only kept
groups whose rewards are not all equal are candidates — the paper's buffer also keeps
only informative samples. The share of new prompts is set by the select stage's batch.

>>> RolloutReplay(groups=16, max_share=0.5, window=4)  # doctest: +ELLIPSIS
RolloutReplay(name=None, type='rollout_replay', groups=16, max_share=0.5, window=4, ...)
"""

from __future__ import annotations

import math
from typing import ClassVar, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field

from gfcr.core.rollout import col
from gfcr.core.row_filter import RowFilter
from gfcr.core.stage import StageSpec, StepContext
from gfcr.core.registry import register
from gfcr.core.storage import History
from stages.replay import _copies, _reads


@register("replay")
class RolloutReplay(StageSpec):
    """Top the batch up to ``groups`` kept groups with recent stored groups.

    At most ``max_share`` of ``groups`` is replayed in one step; a stored group is
    replayed at most ``max_replays`` times and only within ``window`` steps of being
    generated (the staleness bound).
    """

    type: Literal["rollout_replay"] = "rollout_replay"
    groups: int = Field(16, ge=1)
    """Kept groups wanted in the training batch, new and replayed together."""
    max_share: float = Field(0.5, gt=0.0, le=1.0)
    """Most of ``groups`` that may be replayed in one step."""
    window: int = Field(4, ge=1)
    """Replay only rollouts generated in the last ``window`` steps."""
    max_replays: int = Field(2, ge=1)
    """Times one stored rollout may be replayed."""

    reads: ClassVar[frozenset[str]] = frozenset({col.KEPT, col.GROUP_ID, col.REWARD})
    writes: ClassVar[frozenset[str]] = frozenset({col.PARENT_ID, col.REPLAY_COUNT})

    def augment(self, ctx: StepContext, batch: pa.Table) -> pa.Table:
        need = self.shortfall(batch)
        if need <= 0 or ctx.history is None or ctx.step == 0:
            return batch
        stored = recent_trained(ctx.history, now=ctx.step, window=self.window)
        stored = stored.filter(pc.less(stored.column("_times"), self.max_replays))
        rows = self.choose(stored, need, ctx.rng(self.label))
        times = rows.column("_times").to_numpy() + 1
        return _copies.append(batch, _copies.copies(ctx, _reads.as_rollouts(rows), times.tolist(),
                                                    tag=self.label))

    def shortfall(self, batch: pa.Table) -> int:
        """Groups to replay: what the batch lacks of ``groups``, capped by ``max_share``."""
        kept = batch.filter(batch.column(col.KEPT))
        have = len(set(kept.column(col.GROUP_ID).to_pylist()))
        return min(self.groups - have, math.floor(self.max_share * self.groups))

    @staticmethod
    def choose(stored: pa.Table, need: int, rng: np.random.Generator) -> pa.Table:
        """The rows of the ``need`` newest groups (random order among groups of a step)."""
        groups = stored.select([col.STEP, col.GROUP_ID]).group_by([col.STEP, col.GROUP_ID]) \
            .aggregate([]).sort_by([(col.STEP, "descending"), (col.GROUP_ID, "ascending")])
        steps = groups.column(col.STEP).to_numpy()
        order = np.lexsort((rng.permutation(len(steps)), -steps))
        chosen = set(groups.column(col.GROUP_ID).take(pa.array(order[:need], pa.int64())).to_pylist())
        keep = pc.is_in(stored.column(col.GROUP_ID), pa.array(sorted(chosen), pa.string()))
        return stored.filter(keep)


def recent_trained(history: History, *, now: int, window: int) -> pa.Table:
    """The run's original rows kept and trained on in the last ``window`` steps, in groups
    whose kept original rewards there are not all equal (a flat group has no GRPO
    signal), with ``_times``: how often each was replayed already; newest step first,
    then by group and sample."""
    recent = RowFilter(kept=True, replayed=False, step_min=max(int(now) - int(window), 0))
    spread = history.rows(recent, columns=[col.GROUP_ID, col.REWARD]).group_by(
        col.GROUP_ID, use_threads=False).aggregate([(col.REWARD, "min"), (col.REWARD, "max")])
    signal = spread.filter(pc.greater(spread.column(f"{col.REWARD}_max"),
                                      spread.column(f"{col.REWARD}_min"))).column(col.GROUP_ID)
    trained = history.rows(recent.where(status=("complete",), consumed=True))
    rows = trained.filter(pc.is_in(trained.column(col.GROUP_ID), value_set=signal.combine_chunks()))
    rows = rows.sort_by([(col.STEP, "descending"), (col.GROUP_ID, "ascending"),
                         (col.SAMPLE_IDX, "ascending")])
    ids = rows.column(col.ROLLOUT_ID)
    times = np.zeros(rows.num_rows, dtype=np.int64)
    if rows.num_rows:
        used = history.rows(RowFilter(replayed=True, parent_ids=tuple(ids.to_pylist())),
                            columns=[col.PARENT_ID]).column(col.PARENT_ID)
        count = {str(k): int(v) for k, v in zip(*pc.value_counts(used).flatten())} if len(used) else {}
        times = np.array([count.get(i, 0) for i in ids.to_pylist()], dtype=np.int64)
    return rows.append_column("_times", pa.array(times, pa.int64()))
