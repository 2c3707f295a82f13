"""Dynamic sampling (DAPO; Yu et al. 2025): drop groups that carry no learning signal.

A group whose rewards are all equal has zero advantage under any group baseline, so it
only costs compute. Equality is tested with a tolerance (``max - min <= atol + rtol *
max|r|``), not ``std != 0``: floating-point noise must not let a constant group through
(NeMo-RL #4158), and the test works on continuous rewards too (OpenRLHF #1272). Groups
are judged on their own rollouts only, never on leave-one-out statistics (NeMo-RL #3469).
"""

from __future__ import annotations

from collections import defaultdict
from typing import ClassVar, Literal

import numpy as np
import pyarrow as pa
from pydantic import Field, model_validator

from gfcr.core.rollout import col
from gfcr.core.stage import FilterResult, StageSpec, StepContext
from gfcr.core.registry import register


@register("filter")
class DynamicSampling(StageSpec):
    """Drop every rollout of a group whose kept rewards are all equal.

    ``mode="filter"`` only drops. ``mode="refill"`` then asks the loop for more prompts,
    round after round, until ``min_groups`` groups with signal are kept or ``max_rounds``
    extra rounds have run (DAPO's over-sampling; verl's ``max_num_gen_batches``). The
    effective batch is the step metric ``kept_groups``.

    >>> DynamicSampling(mode="refill", min_groups=16, max_rounds=3)  # doctest: +ELLIPSIS
    DynamicSampling(name=None, type='dynamic_sampling', mode='refill', min_groups=16, ...)
    """

    type: Literal["dynamic_sampling"] = "dynamic_sampling"
    mode: Literal["filter", "refill"] = "filter"
    """``filter`` only drops flat groups; ``refill`` also draws more prompts until
    ``min_groups`` are kept."""
    min_groups: int | None = Field(None, ge=1)
    """Refill mode: kept groups wanted per step."""
    max_rounds: int = Field(3, ge=0)
    """Refill mode: at most this many extra rounds per step."""
    atol: float = Field(1e-6, ge=0.0)
    """Absolute tolerance under which two rewards count as equal."""
    rtol: float = Field(1e-6, ge=0.0)
    """Relative tolerance under which two rewards count as equal."""

    reads: ClassVar[frozenset[str]] = frozenset({col.REWARD, col.GROUP_ID})

    @model_validator(mode="after")
    def _refill_needs_target(self) -> "DynamicSampling":
        if self.mode == "refill" and self.min_groups is None:
            raise ValueError("mode='refill' needs min_groups (kept groups wanted per step)")
        return self

    def shortfall(self, ctx: StepContext, rollouts: pa.Table) -> int:
        """Groups still missing, if refilling and rounds remain (gfcr.core.stage.Refill)."""
        if self.mode != "refill" or ctx.round > self.max_rounds:
            return 0
        kept = rollouts.filter(rollouts.column(col.KEPT))
        have = len(set(kept.column(col.GROUP_ID).to_pylist()))
        return max(0, (self.min_groups or 0) - have)

    def apply(self, ctx: StepContext, rollouts: pa.Table) -> FilterResult:
        flat = zero_variance_groups(
            rollouts.column(col.GROUP_ID).to_pylist(),
            rollouts.column(col.REWARD).to_numpy(zero_copy_only=False).astype(float),
            rollouts.column(col.KEPT).to_numpy(zero_copy_only=False),
            atol=self.atol, rtol=self.rtol)
        keep = [g not in flat for g in rollouts.column(col.GROUP_ID).to_pylist()]
        return FilterResult(rollouts, keep=keep, reason="zero_variance")


def zero_variance_groups(group_ids: list[str], rewards: np.ndarray, kept: np.ndarray, *,
                         atol: float, rtol: float) -> set[str]:
    """Groups whose kept, scored rewards are all equal within tolerance."""
    by_group: dict[str, list[float]] = defaultdict(list)
    for g, r, k in zip(group_ids, rewards, kept):
        if k and not np.isnan(r):
            by_group[g].append(r)
    flat = set()
    for g in set(group_ids):
        values = np.asarray(by_group.get(g, []))
        if len(values) < 2 or np.ptp(values) <= atol + rtol * np.abs(values).max():
            flat.add(g)
    return flat
