"""Golden values for the advantage estimators, computed by hand."""

import math

import numpy as np
import pytest

from stages.train.advantages import ADVANTAGES, advantage, lookup_advantage

grpo = lookup_advantage("grpo")
drgrpo = lookup_advantage("drgrpo")


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


@pytest.mark.parametrize("fn", [grpo, drgrpo])
def test_flat_group_under_float_noise_is_exactly_zero(fn):
    rewards = np.array([0.1 + 1e-9, 0.1, 0.1 - 1e-9, 1.0, 0.0])
    a = fn(rewards, np.array([0, 0, 0, 1, 1]))
    assert a[:3].tolist() == [0.0, 0.0, 0.0]
    assert a[3] > 0 > a[4]


@pytest.mark.parametrize("fn", [grpo, drgrpo])
def test_flat_tolerance_is_relative_for_large_rewards(fn):
    # max - min = 1e-4 <= 1e-6 * 1000
    assert fn(np.array([1000.0, 1000.0 + 1e-4]), np.array([0, 0])).tolist() == [0.0, 0.0]


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
    assert {"grpo", "drgrpo"} <= set(ADVANTAGES)
    with pytest.raises(KeyError, match="unknown advantage 'nope'; known: .*grpo"):
        lookup_advantage("nope")
    with pytest.raises(ValueError, match="'grpo' is already registered"):
        advantage("grpo")(lambda r, g: r)
