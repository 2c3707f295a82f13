"""Per-prompt Beta beliefs over the success rate, and the top-k pick the selectors share.

A prompt's belief is ``Beta(k * p0 + s, k * (1 - p0) + n - s)``: ``n`` and ``s`` are its
(discounted) attempts and successes from the store (:func:`stages.replay._reads.
prompt_evidence`), and the prior is centred on the run's own recent pass rate ``p0``
with strength ``k``. An empirical prior rather than Beta(1, 1): a prompt never tried is
believed as hard as the prompts tried lately, which is what a small policy whose pass
rate is a few percent needs (a flat prior would call every new prompt "moderate").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from gfcr.core.rollout import col
from gfcr.core.stage import StepContext
from stages.replay import _reads


@dataclass(frozen=True)
class Beliefs:
    """Beta parameters per pool prompt (aligned with the pool), and the evidence behind."""

    alpha: np.ndarray
    beta: np.ndarray
    n: np.ndarray
    prior_mean: float

    @property
    def mean(self) -> np.ndarray:
        return self.alpha / (self.alpha + self.beta)


def evidence_for(ids: list[str], evidence: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """(n, s) per id of ``ids`` from a ``prompt_evidence`` table; 0 for ids never tried."""
    by_id = dict(zip(evidence.column("prompt_id").to_pylist(),
                     zip(evidence.column("n").to_pylist(), evidence.column("s").to_pylist())))
    pairs = np.array([by_id.get(i, (0.0, 0.0)) for i in ids], dtype=float).reshape(-1, 2)
    return pairs[:, 0], pairs[:, 1]


def beliefs(ctx: StepContext, ids: list[str], *, strength: float, half_life: float | None,
            prior_half_life: float | None = None) -> Beliefs:
    """Beliefs for ``ids`` from the step's history (the prior alone without one).

    ``prior_half_life`` discounts the evidence behind the prior mean separately (VADE's
    second, faster scale); None: the same discount as the per-prompt evidence.
    """
    n = np.zeros(len(ids))
    s = np.zeros(len(ids))
    p0 = 0.5
    if ctx.history is not None:
        evidence = _reads.prompt_evidence(ctx.history, now=ctx.step, half_life=half_life)
        n, s = evidence_for(ids, evidence)
        if prior_half_life is not None and prior_half_life != half_life:
            evidence = _reads.prompt_evidence(ctx.history, now=ctx.step, half_life=prior_half_life)
        p0 = _reads.global_rate(evidence)
    return Beliefs(alpha=strength * p0 + s, beta=strength * (1.0 - p0) + (n - s), n=n,
                   prior_mean=p0)


def informative(mu: np.ndarray, rollouts: int) -> np.ndarray:
    """Probability that a group of ``rollouts`` samples at success rate ``mu`` is mixed
    (not all equal): the share of groups GRPO can learn from."""
    return 1.0 - mu ** rollouts - (1.0 - mu) ** rollouts


def digamma(x: np.ndarray) -> np.ndarray:
    """ψ(x) for x > 0: recurrence up to x >= 6, then the asymptotic series (error < 1e-10)."""
    x = np.asarray(x, dtype=float).copy()
    shift = np.zeros_like(x)
    while np.any(x < 6.0):
        small = x < 6.0
        shift[small] -= 1.0 / x[small]
        x[small] += 1.0
    inv2 = 1.0 / (x * x)
    series = np.log(x) - 0.5 / x - inv2 * (1 / 12 - inv2 * (1 / 120 - inv2 * (1 / 252 - inv2 / 240)))
    return series + shift


def bernoulli_information(alpha: np.ndarray, beta: np.ndarray) -> np.ndarray:
    """Mutual information (nats) between θ ~ Beta(α, β) and one outcome y ~ Bernoulli(θ):
    ``h(μ) - E[h(θ)]``, with ``E[θ ln θ] = μ (ψ(α+1) - ψ(α+β+1))`` and its mirror."""
    mu = alpha / (alpha + beta)
    total = digamma(alpha + beta + 1.0)
    expected_h = -(mu * (digamma(alpha + 1.0) - total)
                   + (1.0 - mu) * (digamma(beta + 1.0) - total))
    return entropy(mu) - expected_h


def entropy(p: np.ndarray) -> np.ndarray:
    """Binary entropy in nats (0 at p = 0 and p = 1)."""
    p = np.clip(np.asarray(p, dtype=float), 1e-12, 1 - 1e-12)
    return -(p * np.log(p) + (1.0 - p) * np.log1p(-p))


# --------------------------------------------------------------------------- picking


def wanted(ctx: StepContext, chosen: pa.Table, batch: int) -> int:
    """How many prompts this select stage adds: up to its batch (or the round's quota)."""
    return (ctx.quota or batch) - chosen.num_rows


def pool(ctx: StepContext, label: str) -> pa.Table:
    """The task's training prompts; ValueError naming the stage if there are none."""
    prompts = ctx.task.train_prompts()
    if prompts.num_rows == 0:
        raise ValueError(f"stage {label!r}: the task has no training prompts")
    return prompts


TIE_DECIMALS = 9
"""Scores equal to this many decimals are ties. Selector scores are sums and products of
floats whose last bits depend on the CPU's SIMD kernels; a choice between two prompts
must not (it did: the same seed drew other prompts on another CPU)."""


def pick(chosen: pa.Table, prompts: pa.Table, scores: np.ndarray, k: int,
         rng: np.random.Generator) -> pa.Table:
    """``chosen`` plus the ``k`` best-scoring prompts not already chosen (scores equal to
    :data:`TIE_DECIMALS` decimals are ties, broken at random by ``rng``, so equal scores
    favour neither the pool's order nor the machine's rounding)."""
    taken = set(chosen.column(col.PROMPT_ID).to_pylist())
    order = rng.permutation(prompts.num_rows)
    rounded = np.round(np.asarray(scores, dtype=float), TIE_DECIMALS)
    order = order[np.argsort(-rounded[order], kind="stable")]
    ids = prompts.column(col.PROMPT_ID).to_pylist()
    picked = [int(i) for i in order if ids[i] not in taken][:k]
    return append(chosen, prompts.take(pa.array(picked, pa.int64())))


def append(chosen: pa.Table, rows: pa.Table) -> pa.Table:
    """``rows`` (a prompt table) appended to ``chosen`` in its columns and types."""
    return pa.concat_tables([chosen, rows.select(chosen.column_names).cast(chosen.schema)])
