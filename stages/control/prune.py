"""Online rollout pruning (ARRoL; "Prune as You Generate: Online Rollout Pruning for Faster
and Better RLVR", 2025).

A quality head trained on the fly predicts, from a partial rollout, whether it will be
correct; rollouts are pruned while they generate so that each group's survivors are
balanced between likely-correct and likely-wrong, which raises the reward variance inside
the group (GRPO's signal) and saves the tokens the pruned ones would have taken.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, Literal, Sequence

import numpy as np
from pydantic import Field

from gfcr.core.engine import Decision, Inflight
from gfcr.core.stage import StageSpec, StepContext
from gfcr.core.registry import register
from stages.control.partial import counting_flight
from stages.control.quality import Head, examples, features, fit, recent_rollouts

MIN_SURVIVORS = 2
"""A group keeps at least this many unpruned samples (an advantage needs two)."""

_HEADS: dict[tuple[Any, ...], Head | None] = {}
"""Fitted heads by (store, run, step, snapshot, stage settings): a cache, never state."""


@register("control")
class OnlinePrune(StageSpec):
    """Prune in-flight rollouts so each group's survivors are correctness-balanced (ARRoL).

    At every segment, the in-flight samples of a group with at least ``min_tokens`` tokens
    are scored by the quality head (:mod:`stages.control.quality`) and split into likely
    correct (p >= 1/2) and likely wrong; the most confident members of the larger side
    (|p - 1/2| >= ``margin``) are pruned until the sides are even, at most
    ``max_prune`` of the group in all and never below two survivors. Pruned rollouts are
    stored with status ``pruned``; the step metrics ``pruned_frac`` and
    ``pruned_token_frac`` give the share of rollouts and tokens pruned.

    State: the head is refitted from the store — the run's complete rollouts of the last
    ``window`` steps, as of the step's history snapshot — and cached per step. The frozen
    config holds nothing; a resumed run prunes exactly as the uninterrupted one. Before
    ``min_examples`` training prefixes exist (early steps, or no store) nothing is pruned.

    Departures: ARRoL's head reads the policy's hidden states inside the engine; this one
    uses logprob features (any engine). Finished samples of a group count as survivors of
    unknown side.

    >>> OnlinePrune(max_prune=0.5, min_tokens=8)  # doctest: +ELLIPSIS
    OnlinePrune(name=None, type='arrol', max_prune=0.5, min_tokens=8, ...)
    """

    type: Literal["arrol"] = "arrol"
    max_prune: float = Field(0.5, ge=0.0, lt=1.0)
    """Most of a group's samples pruned."""
    min_tokens: int = Field(8, ge=1)
    """Tokens a sample needs before it may be judged; also the training-prefix stride."""
    margin: float = Field(0.25, ge=0.0, le=0.5)
    """Only predictions at least this far from 1/2 may be pruned."""
    window: int = Field(4, ge=1)
    """Steps of history the head is trained on."""
    min_examples: int = Field(64, ge=1)
    """Training prefixes the head needs before anything is pruned."""

    owns: ClassVar[frozenset[str]] = frozenset({"prune"})

    def head(self, ctx: StepContext) -> Head | None:
        """The quality head for this step (None: too little history to prune on)."""
        history = ctx.history
        if history is None:
            return None
        key = (history.uri, ctx.run_id, ctx.step, history.snapshot,
               self.min_tokens, self.window, self.min_examples)
        if key not in _HEADS:
            lps, rewards = recent_rollouts(history, ctx.run_id, ctx.step - self.window)
            x, y = examples(lps, rewards, self.min_tokens)
            _HEADS[key] = fit(x, y) if len(y) >= self.min_examples and np.ptp(y) > 0 else None
            while len(_HEADS) > 32:
                _HEADS.pop(next(iter(_HEADS)))
        return _HEADS[key]

    def on_segment(self, ctx: StepContext, inflight: list[Inflight]) -> dict[int, Decision]:
        head = self.head(ctx)
        if head is None:
            return {}
        flight = counting_flight(ctx, self.label)
        views = {v.key: v for v in inflight}
        decisions: dict[int, Decision] = {}
        for keys in flight.members().values():
            live = [views[k] for k in keys
                    if k in views and len(views[k].completion_ids) >= self.min_tokens]
            if not live:
                continue
            pruned = sum(flight.ended.get(k) == "prune" for k in keys)
            budget = min(math.floor(self.max_prune * len(keys)) - pruned,
                         len(keys) - pruned - MIN_SURVIVORS)
            p = head.predict(np.vstack([features(v.logprobs) for v in live]))
            for i in balance_prunes(p, budget, self.margin):
                decisions[live[i].key] = "prune"
        return decisions


def balance_prunes(probs: Sequence[float] | np.ndarray, budget: int,
                   margin: float) -> list[int]:
    """Indices to prune so the likely-correct (p >= 1/2) and likely-wrong sides even out:
    the most confident members of the larger side, only those with |p - 1/2| >= margin,
    at most ``budget``. Ties: the earlier index first."""
    p = np.asarray(probs, dtype=float)
    right = p >= 0.5
    larger = right if right.sum() > (~right).sum() else ~right
    excess = int(larger.sum() - (~larger).sum())
    confident = np.flatnonzero(larger & (np.abs(p - 0.5) >= margin))
    order = sorted(confident, key=lambda i: (-abs(p[i] - 0.5), i))
    return [int(i) for i in order[:max(0, min(budget, excess))]]
