"""Active partial rollouts (APRIL; Zhou et al. 2025, "APRIL: Active Partial Rollouts in
Reinforcement Learning to Tame Long-tail Generation").

A few long responses stall a whole synchronous batch. APRIL over-provisions rollout
requests, stops the remaining ones as soon as the target number of groups is complete,
and continues the stopped ones first in the next step, so nothing is discarded.
"""

from __future__ import annotations

import math
from typing import ClassVar, Literal

import pyarrow as pa
from pydantic import Field

from gfcr.core.engine import Decision, Flight, Inflight
from gfcr.core.rollout import RECYCLE
from gfcr.core.stage import StageSpec, StepContext
from gfcr.core.registry import register


@register("control")
class ActivePartialRollouts(StageSpec):
    """Stop every in-flight sequence once ``ceil(groups / over_provision)`` of the step's
    groups are complete (APRIL, Zhou et al. 2025).

    Over-provisioning is the plan's size: draw ``over_provision`` times the groups a step
    should train on (e.g. ``UniformSampler(batch=12)`` for 8 groups at 1.5); recycled
    groups count towards it and go first. A stopped sequence ends "aborted" (status
    ``partial``, with its policy version); the finished samples of its group are held with
    it, so the group is trained whole once continued (``GroupSample``); ``RecyclePartials``
    must come before, which the pipeline checks (this stage reads its ``recycle`` column).

    Departures: slime counts groups that pass the dynamic-sampling filter; scores exist
    only after generation here, so complete groups count (pair with ``DynamicSampling``
    in refill mode to top up). Every generate call, refill rounds included, is stopped at
    its own target. The count is exact over several engine waves when the engine says
    which requests have started (``gfcr.core.engine.SegmentHook``; the HF engine does when a
    call has more requests than ``max_batch``): requests of a wave that starts after the
    target is met are stopped at their first segment and continued next step like any
    other. With an engine that does not, the stage refuses to decide once it sees a
    second wave.

    >>> ActivePartialRollouts(over_provision=1.5)
    ActivePartialRollouts(name=None, type='april', over_provision=1.5)
    """

    type: Literal["april"] = "april"
    over_provision: float = Field(1.5, ge=1.0)
    """Groups requested per group needed: the target is the plan's groups divided by it."""

    reads: ClassVar[frozenset[str]] = frozenset({RECYCLE})
    owns: ClassVar[frozenset[str]] = frozenset({"stop"})

    def target(self, groups: int) -> int:
        """Complete groups after which the rest is stopped."""
        return max(1, math.ceil(groups / self.over_provision - 1e-9))

    def allocate(self, ctx: StepContext, plan: pa.Table) -> pa.Table:
        """Nothing to allocate; checks that the plan can carry recycled groups."""
        if RECYCLE not in plan.column_names:
            raise ValueError(f"stage {self.label!r}: the plan has no {RECYCLE!r} column; put "
                             "RecyclePartials before it, or stopped rollouts are never continued")
        return plan

    def on_segment(self, ctx: StepContext, inflight: list[Inflight]) -> dict[int, Decision]:
        flight = counting_flight(ctx, self.label)
        groups = len(set(flight.groups.values()))
        if len(flight.complete_groups()) < self.target(groups):
            return {}
        return {view.key: "stop" for view in inflight}


def counting_flight(ctx: StepContext, label: str) -> Flight:
    """``ctx.flight`` when it shows the whole call by groups; a clear error otherwise."""
    flight = ctx.flight
    if flight is None or not flight.groups:
        raise ValueError(f"stage {label!r}: the generate stage declared no request groups "
                         "(SegmentHooks.expect); use a generate stage that does, e.g. GroupSample")
    if flight.split:
        raise ValueError(
            f"stage {label!r}: the engine decoded this call of {len(flight.groups)!r} requests "
            "in several waves without saying which requests had started (a segment hook's "
            "wave(keys), see gfcr.core.engine.SegmentHook), so finished and not-yet-started "
            "requests cannot be told apart; raise the engine's max_batch to at least "
            f"{len(flight.groups)!r}, or lower the requests per step (the replay stage's "
            "batch, the generate stage's n)")
    return flight
