"""The quality head of online pruning (ARRoL; "Prune as You Generate: Online Rollout
Pruning for Faster and Better RLVR", 2025): success probability of a *partial* rollout.

A logistic regression on cheap features of the tokens generated so far — length, mean,
minimum and spread of the behaviour logprobs, mean logprob of the latest tokens, share of
unlikely tokens — fitted by Newton's method with a small L2 penalty. Training examples are
prefixes of the run's complete, scored rollouts of recent steps, cut where a hook could
have seen them in flight (every ``stride`` tokens, shorter than the rollout), labelled
with the rollout's final reward clipped to [0, 1] (soft labels for continuous rewards).

ARRoL trains a small head on the policy's hidden states inside the engine; these
features need no access to the model, so the head works with any engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from gfcr.core.rollout import col
from gfcr.core.row_filter import ASCENDING, DESCENDING, RowFilter
from gfcr.core.storage import History

FEATURES = ("log_length", "mean_logprob", "min_logprob", "std_logprob", "tail_logprob",
            "unlikely_share")
TAIL = 8
"""Latest tokens the ``tail_logprob`` feature averages over."""
UNLIKELY = float(np.log(0.1))
"""A token is unlikely below this logprob."""


def features(logprobs: Sequence[float]) -> np.ndarray:
    """The feature vector of a (partial) rollout from its per-token logprobs."""
    lp = np.asarray(logprobs, dtype=float)
    if len(lp) == 0:
        return np.zeros(len(FEATURES))
    return np.array([np.log1p(len(lp)), lp.mean(), lp.min(), lp.std(), lp[-TAIL:].mean(),
                     (lp < UNLIKELY).mean()])


@dataclass(frozen=True)
class Head:
    """A fitted logistic regression over standardised features."""

    mean: np.ndarray
    scale: np.ndarray
    weights: np.ndarray
    """Intercept first."""
    examples: int

    def predict(self, x: np.ndarray) -> np.ndarray:
        """Success probability of each row of ``x`` (features of partial rollouts)."""
        z = (np.atleast_2d(x) - self.mean) / self.scale
        return _sigmoid(self.weights[0] + z @ self.weights[1:])


def _sigmoid(t: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.clip(t, -30, 30)))


def fit(x: np.ndarray, y: np.ndarray, *, l2: float = 1e-2, iters: int = 25) -> Head:
    """Logistic regression by Newton's method (soft labels ``y`` in [0, 1] allowed)."""
    x, y = np.asarray(x, dtype=float), np.clip(np.asarray(y, dtype=float), 0.0, 1.0)
    mean, scale = x.mean(axis=0), x.std(axis=0)
    scale[scale < 1e-8] = 1.0
    z = np.hstack([np.ones((len(x), 1)), (x - mean) / scale])
    w = np.zeros(z.shape[1])
    penalty = l2 * np.eye(len(w))
    penalty[0, 0] = 0.0  # the intercept is not shrunk
    for _ in range(iters):
        p = _sigmoid(z @ w)
        grad = z.T @ (p - y) / len(y) + penalty @ w
        hess = (z * (p * (1 - p))[:, None]).T @ z / len(y) + penalty + 1e-9 * np.eye(len(w))
        step = np.linalg.solve(hess, grad)
        w -= step
        if np.abs(step).max() < 1e-8:
            break
    return Head(mean=mean, scale=scale, weights=w, examples=len(y))


def examples(logprobs: Sequence[Sequence[float]], rewards: Sequence[float],
             stride: int) -> tuple[np.ndarray, np.ndarray]:
    """Training prefixes: each rollout cut every ``stride`` tokens, strictly shorter
    than itself (a hook only sees a sequence while it runs), labelled by its reward."""
    xs, ys = [], []
    for lp, r in zip(logprobs, rewards):
        for cut in range(stride, len(lp), stride):
            xs.append(features(lp[:cut]))
            ys.append(r)
    if not xs:
        return np.zeros((0, len(FEATURES))), np.zeros(0)
    return np.vstack(xs), np.asarray(ys, dtype=float)


def recent_rollouts(history: History, run_id: str, since_step: int,
                    limit: int = 512) -> tuple[list[list[float]], list[float]]:
    """Logprobs and rewards of the run's complete, scored, original rollouts from
    ``since_step`` on, as of the history's snapshot, newest first."""
    rows = history.rows(RowFilter.attempts(run_ids=(run_id,), step_min=max(int(since_step), 0)),
                        columns=[col.LOGPROBS, col.REWARD], limit=limit,
                        order_by=((col.STEP, DESCENDING), (col.ROLLOUT_ID, ASCENDING)))
    return rows.column(col.LOGPROBS).to_pylist(), rows.column(col.REWARD).to_pylist()
