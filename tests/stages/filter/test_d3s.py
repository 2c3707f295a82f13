"""D³S: max-Var(A) subsets, the |A|·H token mask, and the relaxing schedule."""

from __future__ import annotations

from itertools import combinations

import numpy as np
import pytest

from stages import D3S
from gfcr.core.rollout import TOKEN_KEEP_RATIO
from stages.filter.d3s import max_variance_subset
from stages.train.selection import token_mask
from tests.resources.rollouts import context, rollouts


def test_the_subset_is_the_extremes_and_maximises_variance():
    rng = np.random.default_rng(0)
    assert max_variance_subset(np.arange(6.0), 2, rng).tolist() == [0, 5]
    assert max_variance_subset(np.arange(6.0), 4, rng).tolist() == [0, 1, 4, 5]
    for trial in range(20):
        adv = rng.normal(size=7)
        k = int(rng.integers(2, 7))
        best = max(np.var(adv[list(c)]) for c in combinations(range(7), k))
        assert np.var(adv[max_variance_subset(adv, k, rng)]) == pytest.approx(best)


def test_binary_group_keeps_the_rare_success():
    table = rollouts(["g"] * 8, [1, 0, 0, 0, 0, 0, 0, 0])
    result = D3S(keep=0.5).apply(context(), table)
    assert result.keep[0] and sum(result.keep) == 4
    assert result.reason == "d3s: outside the group's max-Var(A) subset"


def test_balanced_group_keeps_both_sides():
    table = rollouts(["g"] * 8, [1, 1, 1, 1, 0, 0, 0, 0])
    keep = D3S(keep=0.5).apply(context(), table).keep
    assert sum(keep[:4]) == 2 and sum(keep[4:]) == 2


def test_schedule_relaxes_to_no_down_sampling():
    stage = D3S(keep=0.5, token_keep=0.25, relax_steps=100)
    assert stage.shares(0) == (0.5, 0.25)
    assert stage.shares(50) == (0.75, 0.625)
    assert stage.shares(100) == stage.shares(500) == (1.0, 1.0)
    table = rollouts(["g"] * 8, [1, 0, 0, 0, 0, 1, 0, 0])
    late = stage.apply(context(step=200), table)
    assert all(late.keep) and late.table.column(TOKEN_KEEP_RATIO).to_pylist() == [None] * 8
    early = stage.apply(context(step=0), table)
    assert sum(early.keep) == 4
    assert early.table.column(TOKEN_KEEP_RATIO).to_pylist() == [0.25] * 8
    off = D3S(token_keep=None).apply(context(), table).table
    assert off.column(TOKEN_KEEP_RATIO).to_pylist() == [None] * 8


def test_token_mask_keeps_the_largest_abs_advantage_times_entropy():
    # scores: row 0 = 1 * [0.1, 0.5] ; row 1 = 2 * [0.2, 0.05] -> [0.4, 0.1]
    masks = token_mask([1.0, -2.0], [np.array([0.1, 0.5]), np.array([0.2, 0.05])], 0.5)
    assert [m.tolist() for m in masks] == [[False, True], [True, False]]
    assert all(m.all() for m in token_mask([1.0], [np.array([0.3, 0.2])], None))
    assert sum(m.sum() for m in token_mask([0.0, 0.0], [np.ones(3), np.ones(2)], 0.1)) == 5  # ties


def test_groups_smaller_than_two_and_flat_groups_are_kept_whole():
    table = rollouts(["a", "b", "b"], [1, 0, 0])
    assert D3S(keep=0.1).apply(context(), table).keep == [True, True, True]


def test_the_group_advantages_the_subset_was_chosen_on_are_written_for_the_trainer():
    from gfcr.core.rollout import D3S_ADVANTAGE
    from stages.train.advantages import lookup_advantage

    table = rollouts(["g"] * 8 + ["h"], [1, 0, 0, 0, 0, 0, 0, 0, None])
    result = D3S(keep=0.5).apply(context(), table)
    written = result.table.column(D3S_ADVANTAGE).to_pylist()
    grpo = lookup_advantage("grpo")
    whole = grpo(np.array([1.0] + [0.0] * 7), np.zeros(8, int))
    assert written[:8] == pytest.approx(whole.tolist()) and written[8] is None  # unscored
    kept = [i for i in range(8) if result.keep[i]]
    subset = grpo(np.array([1.0, 0.0, 0.0, 0.0]), np.zeros(4, int))
    assert [written[i] for i in kept] != pytest.approx(subset.tolist())  # not renormalised
