"""InSight: prompt selection by weighted mutual information on Beta beliefs.

Zhou et al. 2026, "Efficient RLVR Training via Weighted Mutual Information Data
Selection" (arXiv 2603.01907). Each prompt's success rate has a Beta belief built from the
run's history in the store (:mod:`stages.replay._beliefs`); the acquisition score is the
expected reduction in uncertainty about that rate from one more outcome (the mutual
information ``I(θ; y) = h(μ) - E[h(θ)]``, whose first term depends on difficulty only and
whose second on the evidence gathered) weighted by how likely a GRPO group of
``rollouts`` samples is to carry signal, both evaluated at the belief's *mean* ``μ``
rather than at a sampled outcome, which keeps the score stable.

Departures: the weight is ``1 - μ^n - (1-μ)^n`` (the share of mixed groups of n
rollouts, our reading of the paper's multi-rollout extension); the prior is centred on
the run's recent pass rate (empirical Bayes) instead of being flat.

>>> InSight(batch=16, rollouts=8)
InSight(name=None, type='insight', batch=16, rollouts=8, prior_strength=2.0, half_life=None)
"""

from __future__ import annotations

from typing import ClassVar, Literal

import numpy as np
import pyarrow as pa
from pydantic import Field

from gfcr.core.rollout import PROMPT_COLUMNS, col
from gfcr.core.stage import StageSpec, StepContext
from gfcr.core.registry import register
from stages.replay import _beliefs


@register("replay")
class InSight(StageSpec):
    """Pick the prompts with the highest weighted mutual information (see module doc).

    Prompts already chosen by an earlier select stage count towards ``batch``; in a
    refill round the step's quota replaces it. Ties (e.g. prompts never tried) are broken
    by the step's seeded generator, so a resumed run picks what the original picked.
    """

    type: Literal["insight"] = "insight"
    batch: int = Field(16, ge=1)
    """Prompts per step."""
    rollouts: int = Field(8, ge=1)
    """Samples per prompt the generate stage draws (the n of the weight)."""
    prior_strength: float = Field(2.0, gt=0.0)
    """Pseudo-attempts of the prior centred on the run's pass rate."""
    half_life: float | None = Field(None, gt=0.0)
    """Discount evidence older than this many steps by half (None: keep it all)."""

    writes: ClassVar[frozenset[str]] = PROMPT_COLUMNS

    def scores(self, ctx: StepContext, ids: list[str]) -> np.ndarray:
        """The acquisition score of each prompt id, from the step's history."""
        b = _beliefs.beliefs(ctx, ids, strength=self.prior_strength, half_life=self.half_life)
        weight = _beliefs.informative(b.mean, self.rollouts)
        return weight * _beliefs.bernoulli_information(b.alpha, b.beta)

    def select(self, ctx: StepContext, chosen: pa.Table) -> pa.Table:
        missing = _beliefs.wanted(ctx, chosen, self.batch)
        if missing <= 0:
            return chosen
        prompts = _beliefs.pool(ctx, self.label)
        scores = self.scores(ctx, prompts.column(col.PROMPT_ID).to_pylist())
        return _beliefs.pick(chosen, prompts, scores, missing, ctx.rng(self.label))
