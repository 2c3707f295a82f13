"""Token selectors: which of a batch's loss tokens the policy gradient keeps.

A registry like the advantage estimators' (:mod:`stages.advantages`): one dict plus a
decorator, looked up by name. A selector gets, per row the learner trains on, its
advantage and its tokens' entropies (the policy's next-token entropy at the training
temperature, from the learner's own forward pass; only tokens already in the loss), and
the share to keep (the batch's :data:`gfcr.core.rollout.TOKEN_KEEP_RATIO`, written upstream),
and returns a bool mask per row. The learner asks for entropies only when a batch carries
a share below 1.
"""

from __future__ import annotations

import math
from typing import Callable, Protocol, Sequence

import numpy as np


class TokenSelector(Protocol):
    def __call__(self, advantages: Sequence[float], entropies: Sequence[np.ndarray],
                 ratio: float | None) -> list[np.ndarray]: ...


TOKEN_SELECTORS: dict[str, TokenSelector] = {}
"""name -> selector; filled by :func:`token_selector`."""


def token_selector(name: str) -> Callable[[TokenSelector], TokenSelector]:
    """Decorator: register a selector under ``name``; a second one of that name raises."""
    def decorate(fn: TokenSelector) -> TokenSelector:
        if name in TOKEN_SELECTORS:
            raise ValueError(f"token selector {name!r} is already registered")
        TOKEN_SELECTORS[name] = fn
        return fn
    return decorate


def known_token_selector(name: str) -> str:
    """``name`` if registered; the ValueError lists the known ones (a field validator)."""
    if name not in TOKEN_SELECTORS:
        raise ValueError(f"token selector {name!r} is not registered; known: "
                         f"{', '.join(sorted(TOKEN_SELECTORS))}")
    return name


@token_selector("d3s")
def d3s_tokens(advantages: Sequence[float], entropies: Sequence[np.ndarray],
               ratio: float | None) -> list[np.ndarray]:
    """D³S's token level (Dynamic Dual-Level Down-Sampling, 2025; see
    :mod:`stages.filter.d3s`): per row, True for tokens kept in the loss.

    Keeps the ``ratio`` share of all tokens with the largest ``|A_i| * H_{i,t}`` (at
    least one token; ties at the threshold are kept). ``ratio`` None or >= 1 keeps all.
    """
    if ratio is None or ratio >= 1 or not entropies:
        return [np.ones(len(h), bool) for h in entropies]
    scores = [abs(a) * np.asarray(h, float) for a, h in zip(advantages, entropies)]
    flat = np.concatenate(scores) if scores else np.array([])
    if flat.size == 0:
        return [np.ones(0, bool) for _ in entropies]
    n_keep = max(1, math.ceil(ratio * flat.size))
    threshold = np.partition(flat, flat.size - n_keep)[flat.size - n_keep]
    return [s >= threshold for s in scores]


token_mask = d3s_tokens
"""The name D³S's token rule had when it lived beside the filter."""
