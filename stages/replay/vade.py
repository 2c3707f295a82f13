"""VADE: Thompson sampling on per-prompt Beta posteriors, with two-scale prior decay.

"VADE: Variance-Aware Dynamic Sampling via Online Sample-Level Difficulty Estimation for
Multimodal RL". Instead of rolling out and then discarding groups with no signal (DAPO's
dynamic sampling), VADE keeps a Beta posterior over each prompt's success rate, draws
one rate per prompt from it (Thompson sampling) and picks the prompts whose drawn rate
promises the most signal; the priors decay so the estimates follow the moving policy.

Here: the posterior is read from the store (the run's attempts as of the previous step;
:mod:`stages.replay._beliefs`), the value of a drawn rate θ is the chance that a group
of ``rollouts`` samples is mixed, ``1 - θ^n - (1-θ)^n`` (what GRPO can learn from), and
the two decay scales are (1) per-prompt evidence discounted with ``half_life`` steps and
(2) the prior mean — the run's own recent pass rate — measured with the shorter
``prior_half_life``, so a prompt not seen for a while relaxes towards what the *current*
policy typically achieves. Departure: the paper's exact decay rule and its
multimodal setting are not reproduced; the decay here is exponential forgetting.

>>> VADE(batch=16, rollouts=8, half_life=8.0, prior_half_life=2.0)  # doctest: +ELLIPSIS
VADE(name=None, type='vade', batch=16, rollouts=8, ...)
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
class VADE(StageSpec):
    """Pick the prompts whose Thompson-sampled success rate gives the most mixed groups.

    The draws come from the step's seeded generator (run seed, step, round, stage name),
    so a resumed run draws, and picks, exactly what the original run did.
    """

    type: Literal["vade"] = "vade"
    batch: int = Field(16, ge=1)
    """Prompts per step."""
    rollouts: int = Field(8, ge=1)
    """Samples per prompt the generate stage draws."""
    prior_strength: float = Field(2.0, gt=0.0)
    """Pseudo-attempts of the prior."""
    half_life: float | None = Field(8.0, gt=0.0)
    """Steps after which a prompt's own evidence counts half (None: never decays)."""
    prior_half_life: float | None = Field(2.0, gt=0.0)
    """Steps after which evidence counts half in the prior mean (the faster scale)."""

    writes: ClassVar[frozenset[str]] = PROMPT_COLUMNS

    def scores(self, ctx: StepContext, ids: list[str], rng: np.random.Generator) -> np.ndarray:
        """One Thompson draw per prompt, valued by the share of mixed groups it implies."""
        b = _beliefs.beliefs(ctx, ids, strength=self.prior_strength, half_life=self.half_life,
                             prior_half_life=self.prior_half_life)
        theta = rng.beta(b.alpha, b.beta)
        return _beliefs.informative(theta, self.rollouts)

    def select(self, ctx: StepContext, chosen: pa.Table) -> pa.Table:
        missing = _beliefs.wanted(ctx, chosen, self.batch)
        if missing <= 0:
            return chosen
        prompts = _beliefs.pool(ctx, self.label)
        rng = ctx.rng(self.label)
        scores = self.scores(ctx, prompts.column(col.PROMPT_ID).to_pylist(), rng)
        return _beliefs.pick(chosen, prompts, scores, missing, rng)
