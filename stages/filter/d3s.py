"""D³S: dynamic dual-level down-sampling ("Learning More with Less: A Dynamic Dual-Level
Down-Sampling Framework for Efficient Policy Optimization", 2025).

The policy-gradient norm is bounded by a quantity that grows with the variance of the
advantages in the batch, so a group trains best on its most spread-out rollouts:

- **Sample level**: keep, in each group, the ``k`` rollouts whose advantages have the
  largest variance. The best ``k``-subset is always the ``j`` lowest plus the ``k - j``
  highest advantages for some ``j`` (the extremes); every ``j`` is tried and the most
  balanced one wins ties.
- **Token level**: keep the tokens with the largest ``|A_i| * H_{i,t}`` (advantage
  magnitude times the policy's entropy at that token). The entropy needs the policy's
  logits, which a filter does not have, so this stage writes the kept share and the
  trainer applies it (:data:`gfcr.core.rollout.TOKEN_KEEP_RATIO`; its ``d3s`` token selector,
  :func:`stages.train.selection.d3s_tokens`).
- **Schedule**: both shares start at ``keep`` / ``token_keep`` and relax linearly to 1
  (no down-sampling) over ``relax_steps`` steps: aggressive early, gentle later.

Advantages: the subset is chosen on the group estimator's advantages (``advantage``,
default GRPO) over the whole group — its kept, scored rollouts before down-sampling — and
D³S trains the kept rows on those same advantages: the theory bounds the gradient norm
by the variance of the advantages the update uses, and recomputed on the subset a
std-normalised estimator gives every subset unit variance, so the choice would no longer
reach the gradient (and the token level's ``|A|`` would change too). This stage writes
them as :data:`gfcr.core.rollout.D3S_ADVANTAGE` for every row of the group, and ``stages.train``
trains each kept row on its value as is — in the loss, as the token level's ``|A|`` and as the
stored ``advantage`` — with no renormalisation over the subset
(:meth:`stages.train.masks.BatchMarks.advantages`). They come from this stage's ``advantage``
estimator, not the trainer's.

>>> D3S(keep=0.5, token_keep=0.5, relax_steps=100)  # doctest: +ELLIPSIS
D3S(name=None, type='d3s', keep=0.5, token_keep=0.5, relax_steps=100, advantage='grpo')
"""

from __future__ import annotations

import math
from typing import ClassVar, Literal

import numpy as np
import pyarrow as pa
from pydantic import Field, field_validator

from gfcr.core.rollout import D3S_ADVANTAGE, TOKEN_KEEP_RATIO, col
from gfcr.core.stage import FilterResult, StageSpec, StepContext
from gfcr.core.registry import register
from stages.filter._table import scored_groups, set_column
from stages.advantages import known_advantage, lookup_advantage

@register("filter")
class D3S(StageSpec):
    """Keep each group's max-Var(A) subset; pass the token share on to the trainer."""

    type: Literal["d3s"] = "d3s"
    keep: float = Field(0.5, gt=0.0, le=1.0)
    """Share of each group kept at step 0 (at least 2 rollouts)."""
    token_keep: float | None = Field(0.5, gt=0.0, le=1.0)
    """Share of tokens kept at step 0; None turns the token level off."""
    relax_steps: int = Field(100, ge=1)
    """Steps over which both shares rise linearly to 1 (no down-sampling)."""
    advantage: str = "grpo"
    """Advantage estimator used to rank a group's rollouts (stages/train/advantages.py)."""

    reads: ClassVar[frozenset[str]] = frozenset({col.REWARD, col.GROUP_ID})
    writes: ClassVar[frozenset[str]] = frozenset({TOKEN_KEEP_RATIO, D3S_ADVANTAGE})

    @field_validator("advantage")
    @classmethod
    def _known_advantage(cls, value: str) -> str:
        return known_advantage(value)

    def shares(self, step: int) -> tuple[float, float | None]:
        """(sample share, token share) at ``step``: linear from the start values to 1."""
        t = min(1.0, step / self.relax_steps)
        token = None if self.token_keep is None else self.token_keep + (1 - self.token_keep) * t
        return self.keep + (1 - self.keep) * t, token

    def apply(self, ctx: StepContext, rollouts: pa.Table) -> FilterResult:
        keep_share, token_share = self.shares(ctx.step)
        reward, groups = scored_groups(rollouts)
        estimator = lookup_advantage(self.advantage)
        rng = ctx.rng(self.label)
        keep = np.ones(rollouts.num_rows, bool)
        group_adv = np.full(rollouts.num_rows, np.nan)
        for members in groups.values():
            idx = np.array(members)
            adv = estimator(reward[idx], np.zeros(len(idx), int))
            group_adv[idx] = adv
            k = max(2, math.ceil(keep_share * len(idx)))
            chosen = max_variance_subset(adv, k, rng)
            keep[np.delete(idx, chosen)] = False
        ratio = pa.array([token_share if token_share is not None and token_share < 1 else None]
                         * rollouts.num_rows, pa.float64())
        table = set_column(rollouts, TOKEN_KEEP_RATIO, ratio)
        table = set_column(table, D3S_ADVANTAGE, pa.array(group_adv, pa.float64(),
                                                          from_pandas=True))
        return FilterResult(table, keep=keep.tolist(),
                            reason="d3s: outside the group's max-Var(A) subset")


def max_variance_subset(adv: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """Positions of the ``k`` values of ``adv`` with the largest (population) variance:
    the ``j`` lowest and ``k - j`` highest for the best ``j``; ties between equal values
    are broken at random, ties between ``j`` by balance."""
    n = len(adv)
    if k >= n:
        return np.arange(n)
    order = np.lexsort((rng.random(n), adv))
    best, best_key = order[:k], (-np.inf, -np.inf)
    for j in range(k + 1):
        subset = np.concatenate([order[:j], order[n - (k - j):]])
        key = (round(float(np.var(adv[subset])), 12), -abs(j - k / 2))
        if key > best_key:
            best, best_key = subset, key
    return np.sort(best)
