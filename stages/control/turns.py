"""Turn budgets for multi-turn episodes, after TRACE ("TRACE: A Unified Rollout Budget
Allocation Framework for Efficient Agentic Reinforcement Learning", 2025).

TRACE spends a fixed sampling budget of an agent's turns where they are most likely to
yield mixed terminal rewards, from a predictor of each anchor's success probability. Here
the anchor is the prompt and the predictor its Beta posterior pass rate in the store's
history (``History.prompt_stats``, mean ``m``; an unseen prompt has mean 1/2), and the
budget is the step's policy turns: each fresh prompt's episodes get a turn cap (the plan
column :data:`gfcr.core.rollout.PLAN_MAX_TURNS`, which a multi-turn generate stage honours),
water-filled so that ``sum(n * max_turns) <= budget`` with each cap in
``[min_turns, max_turns]``.
"""

from __future__ import annotations

from typing import ClassVar, Literal

import numpy as np
import pyarrow as pa
from pydantic import Field, model_validator

from gfcr.core.rollout import PLAN_MAX_TURNS, PLAN_N, col
from gfcr.core.stage import StageSpec, StepContext
from gfcr.core.registry import register
from stages.control.allocate import fresh_rows, posterior, put_column
from stages.control.budget import token_caps


@register("control")
class TurnBudget(StageSpec):
    """Split ``budget`` policy turns per step over the plan's fresh prompts as per-episode
    turn caps (plan ``max_turns``).

    ``split``: ``informative`` weighs a prompt by ``m (1 - m)`` (TRACE's mixed-outcome
    criterion: a prompt always or never solved yields no contrast, so its episodes get
    few turns), ``hard`` by ``1 - m`` (more turns where the policy fails: retries and
    tool calls have room), ``uniform`` equally. A plan row's own ``max_turns`` (an
    upstream stage's) bounds its cap; else ``max_turns`` does. Recycled groups and
    branches keep the generate stage's own limit.

    Departures from TRACE: no tree of turn prefixes and no learned predictor; one
    pre-rollout rule per prompt over the history of earlier steps, and the budget is
    turns, not sampled trajectories.

    >>> TurnBudget(budget=96, max_turns=6)  # doctest: +ELLIPSIS
    TurnBudget(name=None, type='turn_budget', budget=96, split='informative', min_turns=1, max_turns=6)
    """

    type: Literal["turn_budget"] = "turn_budget"
    budget: int = Field(64, ge=1)
    """Policy turns per step, over all episodes of the plan's fresh prompts."""
    split: Literal["informative", "hard", "uniform"] = "informative"
    """How the budget is split into per-episode caps (see the class docstring)."""
    min_turns: int = Field(1, ge=1)
    """No episode's cap goes below this."""
    max_turns: int = Field(8, ge=1)
    """No episode's cap goes above this (nor above the plan row's own ``max_turns``)."""

    writes: ClassVar[frozenset[str]] = frozenset({PLAN_MAX_TURNS})
    owns: ClassVar[frozenset[str]] = frozenset({PLAN_MAX_TURNS})

    @model_validator(mode="after")
    def _bounds(self) -> "TurnBudget":
        if self.min_turns > self.max_turns:
            raise ValueError(f"min_turns={self.min_turns!r} exceeds max_turns="
                             f"{self.max_turns!r}")
        return self

    def allocate(self, ctx: StepContext, plan: pa.Table) -> pa.Table:
        fresh = fresh_rows(plan)
        if not len(fresh):
            return plan
        if PLAN_N not in plan.column_names:
            raise ValueError(f"stage {self.label!r}: the plan has no {PLAN_N!r} column "
                             "(the loop fills it from the generate stage)")
        n = plan.column(PLAN_N).to_numpy(zero_copy_only=False)[fresh].astype(float)
        cap = np.full(len(fresh), float(self.max_turns))
        if PLAN_MAX_TURNS in plan.column_names:
            own = plan.column(PLAN_MAX_TURNS).cast(pa.float64()).to_numpy(zero_copy_only=False)
            cap = np.fmin(cap, own[fresh])  # fmin: a null (NaN) leaves max_turns
        weights = np.ones(len(fresh))
        if self.split != "uniform":
            ids = plan.column(col.PROMPT_ID).take(pa.array(fresh)).to_pylist()
            mean, _ = posterior(ctx, ids)
            weights = (mean * (1 - mean) if self.split == "informative" else 1 - mean) + 1e-3
        return put_column(plan, PLAN_MAX_TURNS, fresh,
                          token_caps(weights, n, cap, self.budget, self.min_turns))
