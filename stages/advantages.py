"""Advantage estimators: pure functions from rewards and group ids to advantages.

A registry is one dict plus a decorator; the trainer always looks estimators up by name
through :func:`lookup_advantage`::

    >>> import numpy as np
    >>> lookup_advantage("drgrpo")(np.array([1.0, 0.0, 1.0, 1.0]), np.array([0, 0, 1, 1]))
    array([ 0.5, -0.5,  0. ,  0. ])

The protocol is ``estimator(rewards [N], group_ids [N], components=None) -> [N]``;
``components`` is an optional ``[N, K]`` array of named reward components (the rollout
``rewards`` map, as :func:`stages.reward_components.reward_components` gives it). Only
``gdpo`` reads it; the others accept and ignore it, so
``lookup_advantage(name)(rewards, group_ids)`` works for every name.

Every group estimator gives *exactly* 0 to each row of a flat group, so such rows carry no
gradient whatever the floating-point rounding of the baseline; ``reinforce`` does the same
for a flat batch. A group is flat when its spread (max - min) is within float64 rounding of
its values (``FLAT_ULPS`` units in the last place of max |r|): the spread cannot be told
apart from rounding there. The rule compares the spread with float precision, never with a
fixed share of the rewards' level, so adding a constant to every reward leaves the
advantages of GRPO, Dr. GRPO, RLOO and MC-GRPO unchanged (as the papers' formulas are)
unless the constant is so large that float64 no longer holds the spread.

No step overflows: each group's rewards are divided by a power of two near their largest
magnitude before anything is summed or squared (exact in binary floating point, so the
advantages of ordinary rewards are bit for bit those of the plain formulas), and rewards
of any finite size up to :data:`MAX_REWARD` give finite advantages; a squared deviation of
1e200 would otherwise be inf and turn every advantage of its group into 0.
"""

from __future__ import annotations

from typing import Callable, Literal, NamedTuple, Protocol, Sequence

import numpy as np


class AdvantageFn(Protocol):
    def __call__(self, rewards: np.ndarray, group_ids: np.ndarray,
                 components: np.ndarray | None = None) -> np.ndarray: ...


ADVANTAGES: dict[str, AdvantageFn] = {}
"""name -> estimator ``(rewards, group_ids, components=None) -> advantages``. Filled by
:func:`advantage`."""

EPS = 1e-6
"""Added to the group standard deviation (GRPO) and the batch one (REINFORCE++, GDPO)."""

FLAT_ULPS = 16.0
"""A group is flat when max - min <= FLAT_ULPS * float64 eps * max |r| of the group: a
spread that summing or reordering a few float64 terms can produce by rounding alone."""

MAX_REWARD = float(np.finfo(np.float64).max) / 4
"""Largest reward magnitude taken: ``r - baseline`` of rewards within it fits a float64
(the loop clips rewards to the pipeline's ``reward_range`` long before, gfcr.runner.rewards)."""

MAD_EPS = 1e-3
"""Added to the median absolute deviation by ``mc_grpo(scale="mad")`` (the MC-GRPO
authors' released code uses this value)."""


READS_COMPONENTS: set[str] = set()
"""Estimators registered with ``components=True``: the trainer passes them the rollout
``rewards`` components (the others get None)."""


def advantage(name: str, *, components: bool = False
              ) -> Callable[[AdvantageFn], AdvantageFn]:
    """Decorator: register an estimator under ``name``; a second one of that name raises.
    ``components=True`` declares that it reads the ``rewards`` components."""
    def decorate(fn: AdvantageFn) -> AdvantageFn:
        if name in ADVANTAGES:
            raise ValueError(f"advantage {name!r} is already registered by "
                             # getattr: any callable may be registered
                             f"{getattr(ADVANTAGES[name], '__qualname__', ADVANTAGES[name])}")
        ADVANTAGES[name] = fn
        if components:
            READS_COMPONENTS.add(name)
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
    if np.any(np.abs(rewards) > MAX_REWARD):
        raise ValueError(f"rewards must be within +-{MAX_REWARD:.3g} for r - baseline to fit "
                         f"a float64; got {rewards[np.abs(rewards) > MAX_REWARD][:5]!r}")
    _, index = np.unique(group_ids, return_inverse=True)
    return rewards, index.reshape(-1), int(index.max(initial=-1)) + 1


class _Grouped(NamedTuple):
    """A batch's groups, in *scaled* units: each group's rewards divided by its ``scale``."""

    scaled: np.ndarray    # [N] r / scale: within [-2, 2]
    centred: np.ndarray   # [N] (r - group mean) / scale
    scale: np.ndarray     # [N] the row's group scale, a power of two
    group: np.ndarray     # [N] dense group index
    flat: np.ndarray      # [N] bool: the row's group is flat up to float noise
    sizes: np.ndarray     # [n_groups] float64


def _pow2_scale(level: np.ndarray) -> np.ndarray:
    """A power of two within a factor of two of ``level`` (0.5 where it is 0): dividing by
    it is exact and brings the largest magnitude into [1, 2)."""
    _, exponent = np.frexp(level)
    return np.ldexp(1.0, exponent - 1)


def _in_units(eps: float, scale: np.ndarray) -> np.ndarray:
    """``eps`` in a group's scaled units; inf for groups of subnormal rewards (their
    advantage is then 0, as ``r / (std + eps)`` of such rewards is to float precision)."""
    with np.errstate(over="ignore"):
        return eps / scale


def _centred(rewards: np.ndarray, group_ids: np.ndarray) -> _Grouped:
    """Scaled rewards, (r - group mean) / scale, the scales, group index, per-row flat
    mask and group sizes: the one place every estimator gets its groups, its overflow
    guard and its zero-variance rule from."""
    rewards, index, n = _groups(rewards, group_ids)
    sizes = np.bincount(index, minlength=n).astype(np.float64)
    hi = np.full(n, -np.inf)
    lo = np.full(n, np.inf)
    np.maximum.at(hi, index, rewards)
    np.minimum.at(lo, index, rewards)
    level = np.maximum(np.abs(hi), np.abs(lo), where=sizes > 0, out=np.zeros(n))
    scale = _pow2_scale(level)
    scaled = rewards / scale[index]
    mean = np.bincount(index, weights=scaled, minlength=n) / np.maximum(sizes, 1)
    with np.errstate(invalid="ignore"):  # empty groups: inf - inf, never read
        flat = (hi / scale - lo / scale) <= FLAT_ULPS * np.finfo(np.float64).eps * (
            level / scale)
    return _Grouped(scaled, scaled - mean[index], scale[index], index, flat[index], sizes)


@advantage("grpo")
def grpo(rewards: np.ndarray, group_ids: np.ndarray,
         components: np.ndarray | None = None) -> np.ndarray:
    """GRPO outcome advantage (DeepSeekMath, Shao et al. 2024, eq. 3 / sec. 4.1.2):

        A_i = (r_i - mean(r_group)) / (std(r_group) + 1e-6)

    ``std`` is the sample standard deviation (ddof=1), as TRL and verl compute it.
    A flat group (and a group of one) gets exactly 0. ``components`` is ignored.
    """
    g = _centred(rewards, group_ids)
    var = np.bincount(g.group, weights=g.centred**2, minlength=len(g.sizes))
    std = np.sqrt(var / np.maximum(g.sizes - 1, 1))[g.group]
    out = g.centred / (std + _in_units(EPS, g.scale))
    out[g.flat] = 0.0
    return out


@advantage("drgrpo")
def drgrpo(rewards: np.ndarray, group_ids: np.ndarray,
           components: np.ndarray | None = None) -> np.ndarray:
    """Dr. GRPO advantage (Liu et al. 2025, "Understanding R1-Zero-Like Training: A
    Critical Perspective", sec. 3.1): the group mean is subtracted, no std division,

        A_i = r_i - mean(r_group)

    (the paper also drops the 1/|o_i| length normalisation: use
    ``aggregation="seq_mean_token_sum_norm"`` or ``"token_mean"`` in the loss for that).
    A flat group gets exactly 0. ``components`` is ignored.
    """
    g = _centred(rewards, group_ids)
    out = g.centred * g.scale
    out[g.flat] = 0.0
    return out


@advantage("rloo")
def rloo(rewards: np.ndarray, group_ids: np.ndarray,
         components: np.ndarray | None = None) -> np.ndarray:
    """REINFORCE leave-one-out (Kool et al. 2019, "Buy 4 REINFORCE Samples, Get a Baseline
    for Free!"; Ahmadian et al. 2024, "Back to Basics: Revisiting REINFORCE Style
    Optimization for Learning from Human Feedback in LLMs", sec. 3.2): each rollout's
    baseline is the mean of the *other* G - 1 rollouts of its group,

        A_i = r_i - 1/(G-1) sum_{j != i} r_j = G/(G-1) * (r_i - mean(r_group))

    so the baseline is independent of the rollout it scores (unbiased). A group of one has
    no other rollout and gets 0; a flat group gets exactly 0. ``components`` is ignored.
    """
    g = _centred(rewards, group_ids)
    size = g.sizes[g.group]
    out = g.centred * (size / np.maximum(size - 1, 1)) * g.scale
    out[g.flat | (size < 2)] = 0.0
    return out


@advantage("reinforce")
def reinforce(rewards: np.ndarray, group_ids: np.ndarray,
              components: np.ndarray | None = None) -> np.ndarray:
    """REINFORCE with a batch baseline (Williams 1992), normalised over the whole batch as
    REINFORCE++ does (Hu 2025, "REINFORCE++: A Simple and Efficient Approach for Aligning
    Large Language Models"):

        A_i = (r_i - mean(r_batch)) / (std(r_batch) + 1e-6)

    ``std`` is the population standard deviation (ddof=0), as REINFORCE++ implementations
    whiten. Groups are ignored (``group_ids`` is only checked for its length): rows of a
    flat group are *not* zero here unless the whole batch is flat, which gives exactly 0.
    Departure: REINFORCE++ whitens per token; with one advantage per sequence we whiten
    over sequences, so a long sequence does not weigh more in the batch statistics.
    ``components`` is ignored.
    """
    rewards, _, _ = _groups(rewards, group_ids)
    g = _centred(rewards, np.zeros(len(rewards), dtype=np.int64))
    std = np.sqrt(np.mean(g.centred**2)) if len(rewards) else 0.0
    out = g.centred / (std + _in_units(EPS, g.scale))
    out[g.flat] = 0.0
    return out


def _group_median(values: np.ndarray, index: np.ndarray, n: int) -> np.ndarray:
    """Per-group *lower* median: the middle member of an odd group; of an even group the
    lower of the two middle members (as ``torch.median``), so it is always a member."""
    order = np.lexsort((values, index))
    sizes = np.bincount(index, minlength=n)
    starts = np.cumsum(sizes) - sizes
    return values[order[starts + (sizes - 1) // 2]]


def median_pivots(rewards: np.ndarray, group_ids: np.ndarray) -> np.ndarray:
    """MC-GRPO's pivot rows: a bool mask with exactly one True per group, the *first row in
    row order* whose reward equals the group's (lower) median. Its ``mc_grpo`` advantage is
    exactly 0, so it carries no policy gradient (the trainer drops rows with A == 0)."""
    rewards, index, n = _groups(rewards, group_ids)
    median = _group_median(rewards, index, n)
    rows = np.arange(len(rewards))
    at = rewards == median[index]
    first = np.full(n, len(rewards))
    np.minimum.at(first, index[at], rows[at])
    mask = np.zeros(len(rewards), dtype=bool)
    mask[first] = True
    return mask


@advantage("mc_grpo")
def mc_grpo(rewards: np.ndarray, group_ids: np.ndarray, components: np.ndarray | None = None,
            *, scale: Literal["none", "mad"] = "none") -> np.ndarray:
    """MC-GRPO, median-centred GRPO (Kim 2026, "MC-GRPO: Median-Centered Group Relative
    Policy Optimization for Small-Rollout Reinforcement Learning"): sample G + 1 rollouts
    per prompt and use the group **median** as the baseline, which a single outlier reward
    cannot drag across other rollouts (the "advantage sign flips" of a noisy mean at small G):

        A_i = r_i - median(r_group)                     (scale="none", the default)
        A_i = (r_i - median) / (MAD + 1e-3)             (scale="mad")

    with MAD = median_j |r_j - median|. With an odd group the median is a member, the
    *pivot* (:func:`median_pivots`: the first such row in row order when rewards tie); its
    advantage is exactly 0, so the trainer drops it and G rollouts carry gradient. Rows
    tied with the pivot also get exactly 0 (r_i - median = 0): they carry no policy
    gradient either way.

    Choices where the paper leaves room:

    - even group sizes (a row-level filter such as overlong masking or pruning removed a
      rollout) use the *lower* median, as ``torch.median`` in the authors' code does; it is
      still a member, so there is still exactly one pivot. We do not raise: a run should
      not stop because one group lost a row.
    - default ``scale="none"``. The authors' code divides by MAD + 1e-3; for binary
      rewards the majority value is the median, so MAD = 0 in every odd group and that
      scaling multiplies every advantage by 1000, which only gradient clipping absorbs.
    - the authors' code also multiplies the non-zero advantages of a group by
      (G+1)/(number non-zero); not done here (the GRPO learner averages the loss over the
      rows that carry signal).

    A flat group gets exactly 0. ``components`` is ignored.
    """
    if scale not in ("none", "mad"):
        raise ValueError(f"mc_grpo: scale must be 'none' or 'mad', got {scale!r}")
    g = _centred(rewards, group_ids)
    n = len(g.sizes)
    out = g.scaled - _group_median(g.scaled, g.group, n)[g.group]
    if scale == "mad":
        mad = _group_median(np.abs(out), g.group, n)[g.group]
        out = out / (mad + _in_units(MAD_EPS, g.scale))
    else:
        out = out * g.scale
    out[g.flat] = 0.0
    return out


@advantage("gdpo", components=True)
def gdpo(rewards: np.ndarray, group_ids: np.ndarray, components: np.ndarray | None = None,
         *, weights: Sequence[float] | np.ndarray | None = None) -> np.ndarray:
    """GDPO, group reward-decoupled normalisation (NVIDIA 2026, arXiv 2601.05242, "GDPO:
    Group reward-Decoupled Normalization Policy Optimization for Multi-reward RL
    Optimization").
    GRPO on a summed reward lets the component with the largest spread decide the
    advantage, and distinct combinations collapse onto one value; GDPO normalises each
    component within its group first, then combines, then normalises over the batch:

        A_i^k  = grpo(r^k)_i                        (per component k, within the group)
        S_i    = sum_k w_k A_i^k                    (w = 1 unless ``weights`` is given)
        A_i    = S_i / (std_batch(S) + 1e-6)        (std over all N rows, ddof=1)

    The paper's batch step is (S - mean)/std; each group's S sums to 0 by construction, so
    the batch mean is 0 and only the division is applied (so flat rows stay exactly 0;
    the authors' code uses eps 1e-4, we keep the module's 1e-6).

    ``components`` is ``[N, K]`` (:func:`stages.reward_components.reward_components`); the
    scalar ``rewards`` is then only checked for its length. With ``components=None`` the scalar reward is
    the single component: GRPO followed by the batch normalisation.
    """
    rewards, _, _ = _groups(rewards, group_ids)
    comps = rewards[:, None] if components is None else np.asarray(components, np.float64)
    if comps.ndim != 2 or comps.shape[0] != len(rewards) or comps.shape[1] < 1:
        raise ValueError(f"gdpo: components {comps.shape} must be [N, K] with N = "
                         f"{len(rewards)} rows and K >= 1")
    w = np.ones(comps.shape[1]) if weights is None else np.asarray(weights, np.float64)
    if w.shape != (comps.shape[1],):
        raise ValueError(f"gdpo: weights {w.shape} must have one entry per component "
                         f"({comps.shape[1]})")
    if not np.all(np.isfinite(w)):
        raise ValueError(f"gdpo: weights must be finite; got {w.tolist()!r} (a nan or inf "
                         "weight would make every advantage of the batch nan)")
    if not np.all(np.isfinite(comps)):
        raise ValueError("gdpo: reward components must be finite; got "
                         f"{comps[~np.isfinite(comps)][:5]!r}")
    summed = sum(w[k] * grpo(comps[:, k], group_ids) for k in range(comps.shape[1]))
    summed = np.asarray(summed, dtype=np.float64)
    if len(summed) < 2:
        return np.zeros_like(summed)
    g = _centred(summed, np.zeros(len(summed), dtype=np.int64))  # scaled: no overflow
    std = np.sqrt(np.sum(g.centred**2) / (len(summed) - 1))
    return g.scaled / (std + _in_units(EPS, g.scale))


def known_advantage(name: str) -> str:
    """``name`` if it is registered; the ValueError names it and lists the known ones.
    Configs that take an advantage name use this as their field validator."""
    if name not in ADVANTAGES:
        raise ValueError(f"advantage {name!r} is not registered; known: "
                         f"{', '.join(sorted(ADVANTAGES))}")
    return name
