"""Prompt-GDRO: a multiplicative-weights sampler over difficulty groups.

"Group Distributionally Robust Optimization-Driven Reinforcement Learning for LLM
Reasoning" (Prompt-GDRO): an online classifier sorts prompts into difficulty groups, and
an EMA-debiased multiplicative-weights (EXP3-style) bandit shifts the sampling
distribution towards groups whose loss stays high, so persistently hard groups are not
starved by easy ones (the worst group's loss is what GDRO minimises).

Here the classifier is the run's history in the store: a prompt's group is the bin of
its posterior mean pass rate (``bins`` equal-width bins of [0, 1], prompts never tried
at the prior mean; :mod:`stages.replay._beliefs`). A group's loss at a past step is the
failure rate (1 - pass rate) of its prompts' attempts then, smoothed by a bias-corrected
EMA with ``half_life``; weights are ``exp(eta * cumulative debiased loss)``, mixed with
``gamma`` of the uniform distribution over non-empty groups. Everything is recomputed
from the history as of the previous step, so the sampler has no state to checkpoint and
a resumed run samples exactly what the original did.

Departure: groups are re-binned every step from the current estimates (the paper's
classifier uses pass@k); the loss is the plain failure rate.

>>> PromptGDRO(batch=16, bins=4, eta=0.1, gamma=0.2)  # doctest: +ELLIPSIS
PromptGDRO(name=None, type='prompt_gdro', batch=16, bins=4, eta=0.1, gamma=0.2, ...)
"""

from __future__ import annotations

from typing import ClassVar, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field

from gfcr.core.rollout import PROMPT_COLUMNS, col
from gfcr.core.row_filter import ATTEMPTS
from gfcr.core.stage import StageSpec, StepContext
from gfcr.core.registry import register
from gfcr.core.storage import History
from stages.replay import _beliefs


@register("replay")
class PromptGDRO(StageSpec):
    """Sample a difficulty group by multiplicative weights, then a prompt in it uniformly."""

    type: Literal["prompt_gdro"] = "prompt_gdro"
    batch: int = Field(16, ge=1)
    """Prompts per step."""
    bins: int = Field(4, ge=1)
    """Difficulty groups: equal-width bins of the posterior mean pass rate."""
    eta: float = Field(0.1, gt=0.0)
    """Multiplicative-weights step size."""
    gamma: float = Field(0.2, ge=0.0, le=1.0)
    """Share of uniform exploration over the non-empty groups."""
    half_life: float = Field(4.0, gt=0.0)
    """Half-life, in steps, of the EMA that debiases each group's loss."""

    writes: ClassVar[frozenset[str]] = PROMPT_COLUMNS

    def groups(self, ctx: StepContext, ids: list[str]) -> np.ndarray:
        """The difficulty group (0 = hardest) of each prompt id."""
        mean = _beliefs.beliefs(ctx, ids, strength=2.0, half_life=None).mean
        return np.minimum((mean * self.bins).astype(int), self.bins - 1)

    def weights(self, ctx: StepContext, group_of: dict[str, int]) -> np.ndarray:
        """The sampling distribution over groups (before masking empty ones)."""
        cumulative = np.zeros(self.bins)
        if ctx.history is not None:
            losses = step_losses(ctx.history)
            beta = 0.5 ** (1.0 / self.half_life)
            ema, updates = np.zeros(self.bins), np.zeros(self.bins)
            for step in sorted(set(losses.column("step").to_pylist())):
                part = losses.filter(pc.equal(losses.column("step"), step))
                loss = _group_means(part, group_of, self.bins)
                seen = ~np.isnan(loss)
                ema[seen] = beta * ema[seen] + (1.0 - beta) * loss[seen]
                updates[seen] += 1
                debiased = np.where(updates > 0, ema / (1.0 - beta ** np.maximum(updates, 1)), 0.0)
                cumulative += debiased
        logits = self.eta * cumulative
        return np.exp(logits - logits.max())

    def select(self, ctx: StepContext, chosen: pa.Table) -> pa.Table:
        missing = _beliefs.wanted(ctx, chosen, self.batch)
        if missing <= 0:
            return chosen
        prompts = _beliefs.pool(ctx, self.label)
        ids = prompts.column(col.PROMPT_ID).to_pylist()
        group = self.groups(ctx, ids)
        w = self.weights(ctx, dict(zip(ids, group.tolist())))
        rng = ctx.rng(self.label)
        taken = set(chosen.column(col.PROMPT_ID).to_pylist())
        members: list[list[int]] = [[] for _ in range(self.bins)]
        for i in rng.permutation(len(ids)).tolist():
            if ids[i] not in taken:
                members[group[i]].append(i)
        picked: list[int] = []
        for _ in range(missing):
            live = np.array([bool(m) for m in members])
            if not live.any():
                break
            p = (1.0 - self.gamma) * w * live / (w * live).sum() + self.gamma * live / live.sum()
            picked.append(members[int(rng.choice(self.bins, p=p / p.sum()))].pop())
        return _beliefs.append(chosen, prompts.take(pa.array(picked, pa.int64())))


def step_losses(history: History) -> pa.Table:
    """Per (step, prompt), by step then prompt: attempts ``n`` and failure rate ``loss``
    (the share of attempts without a positive reward), from the attempts' rows."""
    rows = history.rows(ATTEMPTS, columns=[col.STEP, col.PROMPT_ID, col.REWARD])
    failed = pc.if_else(pc.fill_null(pc.greater(rows.column(col.REWARD), 0.0), False), 0.0, 1.0)
    parts = pa.table({"step": rows.column(col.STEP), "prompt_id": rows.column(col.PROMPT_ID),
                      "loss": failed.cast(pa.float64())})
    grouped = parts.group_by(["step", "prompt_id"], use_threads=False).aggregate(
        [("loss", "count"), ("loss", "mean")])
    out = pa.table({"step": grouped.column("step"), "prompt_id": grouped.column("prompt_id"),
                    "n": grouped.column("loss_count"), "loss": grouped.column("loss_mean")})
    return out.sort_by([("step", "ascending"), ("prompt_id", "ascending")])


def _group_means(part: pa.Table, group_of: dict[str, int], bins: int) -> np.ndarray:
    """Attempt-weighted mean loss per group at one step (NaN for a group not attempted)."""
    total, weight = np.zeros(bins), np.zeros(bins)
    for pid, n, loss in zip(part.column("prompt_id").to_pylist(), part.column("n").to_pylist(),
                            part.column("loss").to_pylist()):
        g = group_of.get(pid)
        if g is not None:
            total[g] += n * loss
            weight[g] += n
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(weight > 0, total / weight, np.nan)
