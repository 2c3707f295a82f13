"""Golden values for the advantage estimators, computed by hand."""

import math

import numpy as np
import pytest
import torch

from stages.train.advantages import (ADVANTAGES, advantage, lookup_advantage, median_pivots,
                                     reward_components)
from stages.train.loss import policy_loss

grpo = lookup_advantage("grpo")
drgrpo = lookup_advantage("drgrpo")
rloo = lookup_advantage("rloo")
reinforce = lookup_advantage("reinforce")
mc_grpo = lookup_advantage("mc_grpo")
gdpo = lookup_advantage("gdpo")
GROUP_ESTIMATORS = ["grpo", "drgrpo", "rloo", "mc_grpo", "gdpo"]


def test_grpo_binary_group_golden():
    # mean 0.5, sample std sqrt((4 * 0.25) / 3) = sqrt(1/3)
    a = grpo(np.array([1.0, 0.0, 0.0, 1.0]), np.array(["g", "g", "g", "g"]))
    expected = 0.5 / (math.sqrt(1 / 3) + 1e-6)
    assert a.tolist() == pytest.approx([expected, -expected, -expected, expected], rel=1e-12)


def test_grpo_continuous_rewards_golden():
    # mean 0.5, deviations -0.3, 0, 0.3, sample variance 0.18 / 2 = 0.09, std 0.3
    a = grpo(np.array([0.2, 0.5, 0.8]), np.array([7, 7, 7]))
    assert a.tolist() == pytest.approx([-0.3 / 0.300001, 0.0, 0.3 / 0.300001], abs=1e-12)


def test_grpo_groups_are_independent_and_keep_row_order():
    rewards = np.array([1.0, 5.0, 0.0, 7.0, 3.0])
    groups = np.array(["b", "a", "b", "a", "c"])
    a = grpo(rewards, groups)
    assert a[0] == pytest.approx(0.5 / (math.sqrt(0.5) + 1e-6))  # b: mean .5, std sqrt(.5)
    assert a[2] == pytest.approx(-0.5 / (math.sqrt(0.5) + 1e-6))
    assert a[1] == pytest.approx(-1.0 / (math.sqrt(2.0) + 1e-6))  # a: mean 6, std sqrt(2)
    assert a[3] == pytest.approx(1.0 / (math.sqrt(2.0) + 1e-6))
    assert a[4] == 0.0  # a group of one


@pytest.mark.parametrize("name", GROUP_ESTIMATORS)
def test_flat_group_under_float_noise_is_exactly_zero(name):
    # 0.1 + 0.2 and 0.3 differ by one float64 rounding (5.6e-17): the group is flat
    rewards = np.array([0.1 + 0.2, 0.3, 0.3, 1.0, 0.0, 0.5])
    assert rewards[0] != rewards[1]
    a = lookup_advantage(name)(rewards, np.array([0, 0, 0, 1, 1, 1]))
    assert a[:3].tolist() == [0.0, 0.0, 0.0]
    assert a[3] > 0 > a[4]


@pytest.mark.parametrize("name", GROUP_ESTIMATORS)
def test_a_small_spread_at_a_large_level_is_not_flat(name):
    # (was: a spread of 1e-4 at level 1000 counted as flat, 1e-6 * |mean|)
    fn = lookup_advantage(name)
    a = fn(np.array([1000.0, 1000.0 + 1e-4, 1000.0 + 2e-4]), np.zeros(3))
    assert a[2] > 0 > a[0]


@pytest.mark.parametrize("name", GROUP_ESTIMATORS)
def test_a_group_of_one_gets_zero(name):
    a = lookup_advantage(name)(np.array([3.0, 1.0, 0.0, 0.5]),
                               np.array(["solo", "g", "g", "g"]))
    assert a[0] == 0.0 and a[1] > 0 > a[2]


def test_drgrpo_golden_mean_only():
    a = drgrpo(np.array([1.0, 0.0, 0.0, 1.0, 0.2, 0.5, 0.9]), np.array([0, 0, 0, 0, 1, 1, 1]))
    assert a.tolist() == pytest.approx([0.5, -0.5, -0.5, 0.5, -1 / 3, -1 / 30, 11 / 30],
                                       abs=1e-12)


def test_empty_input():
    assert grpo(np.array([]), np.array([])).shape == (0,)


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="one length"):
        grpo(np.array([1.0, 0.0]), np.array([0]))
    with pytest.raises(ValueError, match="finite"):
        drgrpo(np.array([1.0, np.nan]), np.array([0, 0]))


def test_registry_lookup_and_duplicates():
    assert {"grpo", "drgrpo", "rloo", "reinforce", "mc_grpo", "gdpo"} <= set(ADVANTAGES)
    with pytest.raises(KeyError, match="unknown advantage 'nope'; known: .*grpo"):
        lookup_advantage("nope")
    with pytest.raises(ValueError, match="'grpo' is already registered"):
        advantage("grpo")(lambda r, g: r)


@pytest.mark.parametrize("name", sorted(ADVANTAGES))
def test_every_estimator_takes_two_arguments_or_components(name):
    rewards = np.array([1.0, 0.0, 0.0, 1.0])
    groups = np.array([0, 0, 1, 1])
    fn = lookup_advantage(name)
    plain = fn(rewards, groups)
    # a components array equal to the scalar reward changes nothing for any estimator
    assert fn(rewards, groups, components=rewards[:, None]).tolist() == plain.tolist()
    assert plain.shape == (4,) and np.all(np.isfinite(plain))


# ----------------------------------------------------------------------------- RLOO

def test_rloo_golden_leave_one_out():
    # group a [1, 0, 0, 1]: baseline of row 0 = (0 + 0 + 1) / 3, so 1 - 1/3 = 2/3;
    # row 1: 0 - (1 + 0 + 1)/3 = -2/3. Also G/(G-1) (r - mean) = 4/3 * 0.5 = 2/3.
    # group b [0.2, 0.5, 0.8]: 0.2 - (0.5+0.8)/2 = -0.45; 0.5 - 0.5 = 0; 0.8 - 0.35 = 0.45
    a = rloo(np.array([1.0, 0.0, 0.2, 0.0, 1.0, 0.5, 0.8]),
             np.array(["a", "a", "b", "a", "a", "b", "b"]))
    assert a.tolist() == pytest.approx([2 / 3, -2 / 3, -0.45, -2 / 3, 2 / 3, 0.0, 0.45],
                                       abs=1e-12)


# ------------------------------------------------------------------------ REINFORCE

def test_reinforce_golden_batch_baseline_ignores_groups():
    # batch [1, 0, 0, 1, 1, 1]: mean 4/6 = 2/3; deviations 1/3, -2/3, -2/3, 1/3, 1/3, 1/3;
    # population variance (4 * 1/9 + 2 * 4/9) / 6 = 2/9, std sqrt(2)/3.
    # Group b is flat but not zero: the baseline is the batch's, not the group's.
    a = reinforce(np.array([1.0, 0.0, 0.0, 1.0, 1.0, 1.0]), np.array([0, 0, 0, 0, 1, 1]))
    s = math.sqrt(2) / 3 + 1e-6
    assert a.tolist() == pytest.approx([1 / 3 / s, -2 / 3 / s, -2 / 3 / s, 1 / 3 / s,
                                        1 / 3 / s, 1 / 3 / s], abs=1e-12)


def test_reinforce_flat_batch_is_exactly_zero():
    a = reinforce(np.array([0.1 + 0.2, 0.3, 0.3]), np.array([0, 1, 2]))  # one rounding apart
    assert a.tolist() == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="one length"):
        reinforce(np.array([1.0, 0.0]), np.array([0]))


# -------------------------------------------------------------------------- MC-GRPO

def test_mc_grpo_golden_median_baseline_and_one_pivot():
    # sorted 0.1, 0.2, 0.5, 0.7, 0.9: median 0.5 is row 2, the pivot
    rewards = np.array([0.9, 0.1, 0.5, 0.7, 0.2])
    a = mc_grpo(rewards, np.zeros(5))
    assert a.tolist() == pytest.approx([0.4, -0.4, 0.0, 0.2, -0.3], abs=1e-12)
    assert (a == 0.0).sum() == 1 and a[2] == 0.0
    assert median_pivots(rewards, np.zeros(5)).tolist() == [False, False, True, False, False]


def test_mc_grpo_median_resists_the_outlier_that_flips_the_mean():
    # [0, 0.1, 0.2, 0.3, 10]: mean 2.12 puts 0.3 below the baseline; the median 0.2 does not
    rewards = np.array([0.0, 0.1, 0.2, 0.3, 10.0])
    assert drgrpo(rewards, np.zeros(5))[3] < 0
    assert mc_grpo(rewards, np.zeros(5)).tolist() == pytest.approx([-0.2, -0.1, 0.0, 0.1, 9.8],
                                                                    abs=1e-12)


def test_mc_grpo_ties_pick_the_first_median_row_as_the_pivot():
    # [0, 1, 1, 1, 1]: median 1; the sorted middle is row 2 but the pivot is row 1, the
    # first row in row order that equals the median. Rows tied with it also get 0.
    groups = np.zeros(5)
    pivots = median_pivots(np.array([0.0, 1.0, 1.0, 1.0, 1.0]), groups)
    assert pivots.tolist() == [False, True, False, False, False]
    # binary [1, 0, 1, 1, 0]: median 1, pivot row 0
    rewards = np.array([1.0, 0.0, 1.0, 1.0, 0.0])
    assert median_pivots(rewards, groups).tolist() == [True, False, False, False, False]
    assert mc_grpo(rewards, groups).tolist() == [0.0, -1.0, 0.0, 0.0, -1.0]


def test_mc_grpo_pivots_are_one_per_group_with_interleaved_groups():
    rewards = np.array([3.0, 0.2, 1.0, 0.9, 2.0, 0.4, 7.0])
    groups = np.array(["x", "y", "x", "y", "x", "y", "z"])
    # x [3, 1, 2] median 2 (row 4); y [0.2, 0.9, 0.4] median 0.4 (row 5); z alone (row 6)
    assert median_pivots(rewards, groups).tolist() == [False, False, False, False, True,
                                                        True, True]
    assert mc_grpo(rewards, groups).tolist() == pytest.approx(
        [1.0, -0.2, -1.0, 0.5, 0.0, 0.0, 0.0], abs=1e-12)


def test_mc_grpo_even_group_uses_the_lower_median():
    # sorted 0.1, 0.2, 0.3, 0.4: lower median 0.2 (row 3), a member, so still one pivot
    rewards = np.array([0.4, 0.1, 0.3, 0.2])
    assert mc_grpo(rewards, np.zeros(4)).tolist() == pytest.approx([0.2, -0.1, 0.1, 0.0],
                                                                   abs=1e-12)
    assert median_pivots(rewards, np.zeros(4)).tolist() == [False, False, False, True]


def test_mc_grpo_mad_scale_golden():
    # [0.9, 0.1, 0.5, 0.7, 0.2]: |r - 0.5| = 0.4, 0.4, 0, 0.2, 0.3 -> MAD 0.3
    a = ADVANTAGES["mc_grpo"](np.array([0.9, 0.1, 0.5, 0.7, 0.2]), np.zeros(5), scale="mad")
    d = 0.3 + 1e-3
    assert a.tolist() == pytest.approx([0.4 / d, -0.4 / d, 0.0, 0.2 / d, -0.3 / d], abs=1e-9)
    # binary rewards: MAD is 0, so the authors' scaling multiplies by 1 / 1e-3
    b = ADVANTAGES["mc_grpo"](np.array([1.0, 0.0, 1.0, 1.0, 0.0]), np.zeros(5), scale="mad")
    assert b.tolist() == pytest.approx([0.0, -1000.0, 0.0, 0.0, -1000.0])
    with pytest.raises(ValueError, match="'std'"):
        ADVANTAGES["mc_grpo"](np.array([1.0]), np.zeros(1), scale="std")


def test_mc_grpo_pivot_carries_no_gradient():
    rewards = np.array([0.9, 0.1, 0.5, 0.7, 0.2])
    adv = torch.tensor(mc_grpo(rewards, np.zeros(5)))
    gen = torch.Generator().manual_seed(0)
    old = -torch.rand(5, 3, generator=gen, dtype=torch.float64)
    new = (old + 0.05 * torch.randn(5, 3, generator=gen, dtype=torch.float64)).requires_grad_()
    mask = torch.ones(5, 3, dtype=torch.bool)
    loss, _ = policy_loss(new, old, adv, mask, aggregation="token_mean")
    loss.backward()
    assert torch.all(new.grad[2] == 0.0)
    assert torch.all(new.grad[[0, 1, 3, 4]].abs() > 0)


# ----------------------------------------------------------------------------- GDPO

def test_gdpo_normalises_each_component_so_a_large_scale_does_not_dominate():
    # one group; c1 = correctness [1, 0, 0, 1], c2 = a large-scale reward [0, 100, 100, 100]
    comps = np.array([[1.0, 0.0], [0.0, 100.0], [0.0, 100.0], [1.0, 100.0]])
    groups = np.zeros(4)
    # c1: mean 1/2, sample std sqrt(1/3) -> A1 = a1 * [1, -1, -1, 1], a1 = 0.5/(sqrt(1/3)+eps)
    # c2: mean 75, deviations -75, 25, 25, 25, sample var 7500/3 = 2500, std 50
    #     -> A2 = b * [-3, 1, 1, 1], b = 25 / (50 + eps)
    a1 = 0.5 / (math.sqrt(1 / 3) + 1e-6)
    b = 25 / (50 + 1e-6)
    s = [a1 - 3 * b, -a1 + b, -a1 + b, a1 + b]  # sums to 0
    # batch std (ddof 1): sum of squares 4 a1^2 - 8 a1 b + 12 b^2, over 3
    std = math.sqrt((4 * a1**2 - 8 * a1 * b + 12 * b**2) / 3)
    a = gdpo(comps.sum(axis=1), groups, components=comps)
    assert a.tolist() == pytest.approx([x / (std + 1e-6) for x in s], abs=1e-12)
    # rows 1 and 3 differ only in correctness. GRPO on the sum [1, 100, 100, 101]: mean
    # 75.5, std sqrt((74.5^2 + 2 * 24.5^2 + 25.5^2) / 3) = sqrt(2467) ~ 49.67, so the gap
    # is 1/49.67 ~ 0.020; GDPO's gap is 2 a1 / std ~ 1.732 / 0.919 ~ 1.88
    summed = grpo(comps.sum(axis=1), groups)
    assert summed[3] - summed[1] == pytest.approx(1 / (math.sqrt(2467) + 1e-6))
    assert a[3] - a[1] == pytest.approx(2 * a1 / (std + 1e-6))
    assert a[3] - a[1] > 80 * (summed[3] - summed[1])


def test_gdpo_weights_and_batch_std_across_groups_golden():
    # x: c1 [1, 0] -> +-p, p = 0.5/(sqrt(0.5)+eps); c2 flat -> 0
    # y: c1 flat -> 0;   c2 [3, 1] -> +-q, q = 1/(sqrt(2)+eps)
    # weights (2, 1): S = [2p, -2p, q, -q]; batch std sqrt((8 p^2 + 2 q^2) / 3)
    comps = np.array([[1.0, 0.0], [0.0, 0.0], [1.0, 3.0], [1.0, 1.0]])
    groups = np.array(["x", "x", "y", "y"])
    a = ADVANTAGES["gdpo"](np.zeros(4), groups, components=comps, weights=[2.0, 1.0])
    p = 0.5 / (math.sqrt(0.5) + 1e-6)
    q = 1 / (math.sqrt(2) + 1e-6)
    std = math.sqrt((8 * p**2 + 2 * q**2) / 3) + 1e-6
    assert a.tolist() == pytest.approx([2 * p / std, -2 * p / std, q / std, -q / std],
                                       abs=1e-12)


def test_gdpo_without_components_is_batch_normalised_grpo():
    # grpo: s * [1, -1, -1, 1, 0, 0], s = 0.5/(sqrt(1/3)+eps); batch std (ddof 1) over
    # the six rows: sqrt(4 s^2 / 5) = 2 s / sqrt(5)
    a = gdpo(np.array([1.0, 0.0, 0.0, 1.0, 2.0, 2.0]), np.array([0, 0, 0, 0, 1, 1]))
    s = 0.5 / (math.sqrt(1 / 3) + 1e-6)
    v = s / (2 * s / math.sqrt(5) + 1e-6)
    assert a.tolist() == pytest.approx([v, -v, -v, v, 0.0, 0.0], abs=1e-12)
    assert a[4] == 0.0 and a[5] == 0.0


def test_gdpo_shape_errors_name_the_argument():
    with pytest.raises(ValueError, match="components"):
        gdpo(np.zeros(3), np.zeros(3), components=np.zeros((2, 2)))
    with pytest.raises(ValueError, match="weights"):
        ADVANTAGES["gdpo"](np.zeros(2), np.zeros(2), components=np.zeros((2, 2)),
                           weights=[1.0])


def test_reward_components_from_the_rollout_map_column():
    names, c = reward_components([[("b", 1.0), ("a", 2.0)], {"a": 0.5, "b": 0.0}])
    assert names == ["a", "b"] and c.tolist() == [[2.0, 1.0], [0.5, 0.0]]
    with pytest.raises(ValueError, match="row 1"):
        reward_components([{"a": 1.0, "b": 0.0}, {"a": 1.0}])
