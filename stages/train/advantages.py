"""Advantage estimators: pure functions from rewards and group ids to advantages.

A registry is one dict plus a decorator; the trainer always looks estimators up by name
through :func:`lookup_advantage`::

    >>> import numpy as np
    >>> lookup_advantage("drgrpo")(np.array([1.0, 0.0, 1.0, 1.0]), np.array([0, 0, 1, 1]))
    array([ 0.5, -0.5,  0. ,  0. ])

Every estimator gives *exactly* 0 to each row of a group whose rewards are equal up to float
noise (max - min <= 1e-6 * max(1, |mean|)), so such rows carry no gradient whatever the
floating-point rounding of the mean.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

AdvantageFn = Callable[[np.ndarray, np.ndarray], np.ndarray]

ADVANTAGES: dict[str, AdvantageFn] = {}
"""name -> estimator ``(rewards, group_ids) -> advantages``. Filled by :func:`advantage`."""

EPS = 1e-6
"""Added to the group standard deviation (GRPO) and the relative zero-variance tolerance."""


def advantage(name: str) -> Callable[[AdvantageFn], AdvantageFn]:
    """Decorator: register an estimator under ``name``; a second one of that name raises."""
    def decorate(fn: AdvantageFn) -> AdvantageFn:
        if name in ADVANTAGES:
            raise ValueError(f"advantage {name!r} is already registered by "
                             f"{ADVANTAGES[name].__qualname__}")
        ADVANTAGES[name] = fn
        return fn
    return decorate


def lookup_advantage(name: str) -> AdvantageFn:
    """The estimator registered as ``name``; KeyError lists the known ones."""
    try:
        return ADVANTAGES[name]
    except KeyError:
        known = ", ".join(sorted(ADVANTAGES))
        raise KeyError(f"unknown advantage {name!r}; known: {known}") from None


def _groups(rewards: np.ndarray, group_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """Validated float rewards, the dense group index of each row, and the group count."""
    rewards = np.asarray(rewards, dtype=np.float64)
    group_ids = np.asarray(group_ids)
    if rewards.ndim != 1 or rewards.shape != group_ids.shape:
        raise ValueError(f"rewards {rewards.shape} and group_ids {group_ids.shape} must be "
                         "1-D arrays of one length")
    if not np.all(np.isfinite(rewards)):
        raise ValueError(f"rewards must be finite; got {rewards[~np.isfinite(rewards)][:5]!r}")
    _, index = np.unique(group_ids, return_inverse=True)
    return rewards, index.reshape(-1), int(index.max(initial=-1)) + 1


def _centred(rewards: np.ndarray, group_ids: np.ndarray) -> tuple[np.ndarray, ...]:
    """(r - group mean, group index, per-row flat mask, group sizes) for the estimators."""
    rewards, index, n = _groups(rewards, group_ids)
    sizes = np.bincount(index, minlength=n).astype(np.float64)
    mean = np.bincount(index, weights=rewards, minlength=n) / np.maximum(sizes, 1)
    hi = np.full(n, -np.inf)
    lo = np.full(n, np.inf)
    np.maximum.at(hi, index, rewards)
    np.minimum.at(lo, index, rewards)
    flat = (hi - lo) <= EPS * np.maximum(1.0, np.abs(mean))
    return rewards - mean[index], index, flat[index], sizes


@advantage("grpo")
def grpo(rewards: np.ndarray, group_ids: np.ndarray) -> np.ndarray:
    """GRPO outcome advantage (DeepSeekMath, Shao et al. 2024, eq. 3 / sec. 4.1.2):

        A_i = (r_i - mean(r_group)) / (std(r_group) + 1e-6)

    ``std`` is the sample standard deviation (ddof=1), as TRL and verl compute it.
    A flat group (and a group of one) gets exactly 0.
    """
    centred, index, flat, sizes = _centred(rewards, group_ids)
    var = np.bincount(index, weights=centred**2, minlength=len(sizes)) / np.maximum(sizes - 1, 1)
    out = centred / (np.sqrt(var)[index] + EPS)
    out[flat] = 0.0
    return out


@advantage("drgrpo")
def drgrpo(rewards: np.ndarray, group_ids: np.ndarray) -> np.ndarray:
    """Dr. GRPO advantage (Liu et al. 2025, "Understanding R1-Zero-Like Training: A
    Critical Perspective", sec. 3.1): the group mean is subtracted, no std division,

        A_i = r_i - mean(r_group)

    (the paper also drops the 1/|o_i| length normalisation: use ``aggregation="token_mean"``
    in the loss for that). A flat group gets exactly 0.
    """
    centred, _, flat, _ = _centred(rewards, group_ids)
    centred[flat] = 0.0
    return centred


def known_advantage(name: str) -> str:
    """``name`` if it is registered; the ValueError names it and lists the known ones.
    Configs that take an advantage name use this as their field validator."""
    if name not in ADVANTAGES:
        raise ValueError(f"advantage {name!r} is not registered; known: "
                         f"{', '.join(sorted(ADVANTAGES))}")
    return name
