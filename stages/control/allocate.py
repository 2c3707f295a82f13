"""Per-prompt rollout allocation under a fixed total budget, compute-neutral by construction.

Three rules from the rollout-allocation papers, each read off the Beta posterior of a
prompt's pass rate in the store's history (``History.prompt_stats``: Beta(1 + successes,
1 + failures); an unseen prompt has the Beta(1, 1) prior, mean 1/2):

- ``uncertainty`` (XRPO, "Pushing the limits of GRPO with Targeted Exploration and
  Exploitation", 2025): samples go where they shrink the posterior variance most. With
  mean ``m`` and ``s = attempts + 2`` pseudo-counts the variance after ``k`` more samples is
  about ``m (1 - m) / (s + k + 1)``; each sample goes greedily to the largest decrease.
- ``sqrt`` (Rollout-GDRO, "Group Distributionally Robust Optimization-Driven RL for LLM
  Reasoning", 2025): the square-root rule, ``n ∝ sqrt(m (1 - m))``, the per-prompt
  standard deviation of the reward (Neyman allocation).
- ``hard`` (DARS, "Depth-Breadth Synergy in RLVR", 2025): hard prompts get more samples,
  ``n ∝ 1 / m``, which evens out the expected number of correct samples per prompt.

Departures: XRPO's allocator and GDRO's shadow-price controller work per difficulty
group, DARS runs extra rollout rounds inside a step; here all three are one pre-rollout
rule per prompt over the history of earlier steps, with the total exact.
"""

from __future__ import annotations

import heapq
from typing import ClassVar, Literal

import numpy as np
import pyarrow as pa
from pydantic import Field, model_validator

from gfcr.core.rollout import col
from gfcr.core.rollout import RECYCLE
from gfcr.core.stage import StageSpec, StepContext
from gfcr.core.registry import register

Rule = Literal["uncertainty", "sqrt", "hard"]


@register("control")
class RolloutAllocator(StageSpec):
    """Write the plan's ``n``: ``budget`` samples per step over its fresh prompts, exactly,
    each prompt between ``min_n`` and ``max_n``, split by ``rule``.

    Recycled groups (``recycle`` column) keep their size and are not counted.

    >>> RolloutAllocator(budget=64, rule="sqrt")  # doctest: +ELLIPSIS
    RolloutAllocator(name=None, type='rollout_allocator', budget=64, rule='sqrt', ...)
    """

    type: Literal["rollout_allocator"] = "rollout_allocator"
    budget: int = Field(64, ge=1)
    """Samples per step, summed over the fresh prompts of the plan."""
    rule: Rule = "uncertainty"
    """``uncertainty``: greedy posterior-variance reduction; ``sqrt``: proportional to
    sqrt(m(1-m)); ``hard``: to 1/m (m: a prompt's posterior mean pass rate)."""
    min_n: int = Field(2, ge=1)
    """At least this many samples per prompt (2: a group needs two for an advantage)."""
    max_n: int = Field(32, ge=1)
    """At most this many samples per prompt."""

    writes: ClassVar[frozenset[str]] = frozenset({"n"})
    owns: ClassVar[frozenset[str]] = frozenset({"n"})

    @model_validator(mode="after")
    def _bounds(self) -> "RolloutAllocator":
        if self.min_n > self.max_n:
            raise ValueError(f"min_n={self.min_n!r} must not exceed max_n={self.max_n!r}")
        return self

    def allocate(self, ctx: StepContext, plan: pa.Table) -> pa.Table:
        fresh = fresh_rows(plan)
        if not len(fresh):
            return plan
        total = len(fresh)
        if not self.min_n * total <= self.budget <= self.max_n * total:
            raise ValueError(f"stage {self.label!r}: budget={self.budget!r} samples cannot be "
                             f"split over {total} prompts with min_n={self.min_n!r}, "
                             f"max_n={self.max_n!r}")
        ids = plan.column(col.PROMPT_ID).take(pa.array(fresh)).to_pylist()
        mean, attempts = posterior(ctx, ids)
        n = allocation(self.rule, mean, attempts, self.budget, self.min_n, self.max_n)
        return put_column(plan, "n", fresh, n)


def put_column(plan: pa.Table, name: str, rows: np.ndarray, values: np.ndarray) -> pa.Table:
    """``plan`` with int64 column ``name`` set to ``values`` at ``rows`` (added if missing;
    other rows keep their value, null if it had none)."""
    if name in plan.column_names:
        old = plan.column(name).cast(pa.int64()).to_pylist()
    else:
        old = [None] * plan.num_rows
    for i, v in zip(rows, values):
        old[int(i)] = int(v)
    column = pa.array(old, pa.int64())
    if name in plan.column_names:
        return plan.set_column(plan.schema.get_field_index(name), name, column)
    return plan.append_column(name, column)


def fresh_rows(plan: pa.Table) -> np.ndarray:
    """Indices of plan rows that are not recycled groups."""
    if RECYCLE not in plan.column_names:
        return np.arange(plan.num_rows)
    return np.flatnonzero(plan.column(RECYCLE).is_null().to_numpy(zero_copy_only=False))


def posterior(ctx: StepContext, prompt_ids: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Beta posterior mean of each prompt's pass rate, and its attempts, from the history
    (the prior, mean 1/2 and no attempts, when the run has no store)."""
    if ctx.history is None:
        return np.full(len(prompt_ids), 0.5), np.zeros(len(prompt_ids))
    stats = ctx.history.prompt_stats(prompt_ids)
    return (stats.column("posterior_mean").to_numpy(zero_copy_only=False).astype(float),
            stats.column("attempts").to_numpy(zero_copy_only=False).astype(float))


def allocation(rule: Rule, mean: np.ndarray, attempts: np.ndarray, total: int, lo: int,
               hi: int) -> np.ndarray:
    """Samples per prompt under ``rule``; sums to ``total``, each in ``[lo, hi]``."""
    if rule == "uncertainty":
        return greedy_variance(mean, attempts, total, lo, hi)
    mean = np.clip(mean, 1e-6, 1 - 1e-6)
    weights = np.sqrt(mean * (1 - mean)) if rule == "sqrt" else 1.0 / mean
    return apportion(weights, total, lo, hi)


def greedy_variance(mean: np.ndarray, attempts: np.ndarray, total: int, lo: int,
                    hi: int) -> np.ndarray:
    """Start every prompt at ``lo``; give each further sample to the prompt whose posterior
    variance it reduces most (ties: the earlier prompt). Optimal: the decrease shrinks."""
    n = np.full(len(mean), lo, dtype=np.int64)
    spread = mean * (1 - mean)
    s = attempts + 2.0

    def gain(i: int) -> float:
        k = n[i]
        return spread[i] * (1 / (s[i] + k + 1) - 1 / (s[i] + k + 2))

    heap = [(-gain(i), i) for i in range(len(n)) if n[i] < hi]
    heapq.heapify(heap)
    for _ in range(total - int(n.sum())):
        _, i = heapq.heappop(heap)
        n[i] += 1
        if n[i] < hi:
            heapq.heappush(heap, (-gain(i), i))
    return n


def apportion(weights: np.ndarray, total: int, lo: int, hi: int) -> np.ndarray:
    """Integers in ``[lo, hi]`` summing exactly to ``total``, as near ``∝ weights`` as the
    bounds allow: water-filling for the real shares, then largest remainders."""
    weights = np.asarray(weights, dtype=float)
    if len(weights) == 0:
        return np.zeros(0, dtype=np.int64)
    if not lo * len(weights) <= total <= hi * len(weights):
        raise ValueError(f"cannot split {total!r} into {len(weights)} parts in [{lo}, {hi}]")
    if not np.all(np.isfinite(weights)) or weights.sum() <= 0:
        weights = np.ones_like(weights)
    low, high = 0.0, float(total) / max(weights.min(initial=1.0), 1e-12) + hi
    for _ in range(100):  # bisection on the scale: sum(clip(scale * w)) is monotone
        mid = (low + high) / 2
        if np.clip(mid * weights, lo, hi).sum() < total:
            low = mid
        else:
            high = mid
    share = np.clip(high * weights, lo, hi)
    n = np.floor(share + 1e-9).astype(np.int64)
    order = sorted(range(len(n)), key=lambda i: (-(share[i] - n[i]), i))
    for i in order:
        if n.sum() >= total:
            break
        if n[i] < hi:
            n[i] += 1
    while n.sum() > total:  # float slack the other way: take from the largest above lo
        i = int(np.argmax(np.where(n > lo, n, -1)))
        n[i] -= 1
    return n
