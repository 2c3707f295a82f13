"""Token budgets (DUET; "DUET: Optimize Token-Budget Allocation for Reinforcement Learning
with Verifiable Rewards", 2025).

DUET controls both sides of a step's token spend: before rollout, a cheap surrogate of
each prompt's informativeness decides how much of the budget the prompt gets; during
rollout, an abort rule stops generation once the budget is spent.
"""

from __future__ import annotations

from typing import ClassVar, Literal

import numpy as np
import pyarrow as pa
from pydantic import Field

from gfcr.core.engine import Decision, Inflight
from gfcr.core.rollout import col
from gfcr.core.stage import StageSpec, StepContext
from gfcr.core.registry import register
from stages.control.allocate import fresh_rows, posterior, put_column
from gfcr.core.rollout import RECYCLE


@register("control")
class TokenBudget(StageSpec):
    """Spend at most ``budget`` generated tokens per step: split it across the plan's fresh
    prompts as per-sample caps (plan ``max_tokens``), and abort what is still in flight
    once the step has generated ``budget`` tokens.

    ``split``: ``informative`` weighs a prompt by ``m (1 - m)``, ``m`` the Beta posterior
    mean of its pass rate in the store's history (DUET's pre-rollout surrogate of
    informativeness: a prompt always or never solved teaches nothing), ``uniform`` weighs
    prompts equally, ``off`` leaves the caps alone. The caps are water-filled so that
    ``sum(n * max_tokens) == budget`` (within rounding) where ``min_tokens`` and the
    generate stage's own cap allow, so the plan's worst case fits the budget.
    ``abort``: ``prune`` discards what is in flight when the budget runs out (survivors
    train as smaller groups), ``stop`` keeps it as partial rollouts to continue (needs
    ``RecyclePartials``, and owns the stop decision), ``off`` never aborts.

    Departures: DUET's abort is gated on a reasoning marker and its survivors are
    importance-reweighted; here the abort is a plain budget rule and no reweighting is done
    (the trainer has no per-row weights). Recycled groups are continued under the generate
    stage's own cap; their new tokens count towards the abort rule.

    >>> TokenBudget(budget=2048, split="informative", abort="prune")  # doctest: +ELLIPSIS
    TokenBudget(name=None, type='token_budget', budget=2048, split='informative', ...)
    """

    type: Literal["token_budget"] = "token_budget"
    budget: int = Field(4096, ge=1)
    """Generated tokens per step, all samples of all prompts."""
    split: Literal["informative", "uniform", "off"] = "informative"
    """How the budget is split into per-sample caps (see the class docstring)."""
    min_tokens: int = Field(4, ge=1)
    """No sample's cap goes below this."""
    abort: Literal["prune", "stop", "off"] = "prune"
    """What happens to in-flight samples once the budget is spent (see the class docstring)."""

    writes: ClassVar[frozenset[str]] = frozenset({"max_tokens"})

    @property
    def owns(self) -> frozenset[str]:
        """max_tokens, and the stop decision when aborting keeps partial rollouts."""
        return frozenset({"max_tokens"} | ({"stop"} if self.abort == "stop" else set()))

    @property
    def reads(self) -> frozenset[str]:
        """Stopped rollouts must be continued: ``abort="stop"`` needs RecyclePartials."""
        return frozenset({RECYCLE}) if self.abort == "stop" else frozenset()

    def allocate(self, ctx: StepContext, plan: pa.Table) -> pa.Table:
        fresh = fresh_rows(plan)
        if self.split == "off" or not len(fresh):
            return plan
        for needed in ("n", "max_tokens"):
            if needed not in plan.column_names:
                raise ValueError(f"stage {self.label!r}: the plan has no {needed!r} column "
                                 "(the loop fills it from the generate stage)")
        n = plan.column("n").to_numpy(zero_copy_only=False)[fresh].astype(float)
        cap = plan.column("max_tokens").to_numpy(zero_copy_only=False)[fresh].astype(float)
        weights = np.ones(len(fresh))
        if self.split == "informative":
            ids = plan.column(col.PROMPT_ID).take(pa.array(fresh)).to_pylist()
            mean, _ = posterior(ctx, ids)
            weights = mean * (1 - mean) + 1e-3
        return put_column(plan, "max_tokens", fresh,
                          token_caps(weights, n, cap, self.budget, self.min_tokens))

    def on_segment(self, ctx: StepContext, inflight: list[Inflight]) -> dict[int, Decision]:
        if self.abort == "off" or ctx.flight is None or ctx.flight.spent() < self.budget:
            return {}
        decision: Decision = "prune" if self.abort == "prune" else "stop"
        return {view.key: decision for view in inflight}


def token_caps(weights: np.ndarray, n: np.ndarray, cap: np.ndarray, budget: int,
               low: int) -> np.ndarray:
    """Per-sample caps ``clip(scale * w, low, cap)`` (floored) with the largest scale for
    which ``sum(n * caps) <= budget``; every cap is ``low`` if even that overspends."""
    low_caps = np.minimum(float(low), cap)
    if (n * low_caps).sum() >= budget:
        return low_caps.astype(np.int64)
    lo, hi = 0.0, float(cap.max()) / max(float(weights.min()), 1e-12) + 1.0
    for _ in range(100):
        mid = (lo + hi) / 2
        if (n * np.floor(np.clip(mid * weights, low_caps, cap))).sum() <= budget:
            lo = mid
        else:
            hi = mid
    return np.floor(np.clip(lo * weights, low_caps, cap)).astype(np.int64)
