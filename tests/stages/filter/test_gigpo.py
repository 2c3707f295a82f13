"""GiGPO's two-level advantages (stages.filter.gigpo), golden values worked by hand."""

import pyarrow as pa
import pytest

from gfcr.core.rollout import TURN_ADVANTAGES
from gfcr.core.trajectory import TURNS_TYPE
from stages.filter._turns import discounted, step_rewards
from stages.filter.gigpo import GiGPO
from tests.resources.rollouts import context, rollouts


def turn(source, ids, reward=None):
    role = {"environment": "user", "tool": "tool"}.get(source, "assistant")
    policy = source == "policy"
    return {"role": role, "source": source, "token_ids": ids,
            "logprobs": [-0.5] * len(ids) if policy else None,
            "mask": [True] * len(ids) if policy else None,
            "tool_name": None, "tool_error": None, "reward": reward}


def episode(first, second, observation, third=None):
    """Prompt [1, 2], a policy turn, an environment answer ``observation``, a policy turn
    (and a third one after the same answer when given)."""
    turns = [turn("environment", [1, 2]), turn("policy", [first]),
             turn("environment", observation), turn("policy", [second])]
    if third is not None:
        turns += [turn("environment", observation), turn("policy", [third])]
    return turns


def table(episodes, rewards, groups, kept=None):
    n = len(episodes)
    t = rollouts(groups, rewards, kept=kept or [True] * n)
    return t.set_column(t.column_names.index("turns"), "turns", pa.array(episodes, TURNS_TYPE))


# Group g: A and B see the same answer [5] after their first step, C sees [6]; h holds
# one trajectory identical to A's. gamma = 0.5, rewards 1, 0, 1 (mean 2/3), no
# per-turn rewards, so each episode's step returns are (gamma R, R).
EPISODES = [episode(10, 11, [5]), episode(12, 13, [5]), episode(14, 15, [6]),
            episode(10, 11, [5])]
REWARDS = [1.0, 0.0, 1.0, 1.0]
GROUPS = ["g", "g", "g", "h"]


def test_golden_centred_advantages():
    """normalize='none': A^E = R - 2/3 = (1/3, -2/3, 1/3); first steps share the prompt:
    returns (.5, 0, .5), mean 1/3, A^S = (1/6, -1/3, 1/6); second steps: A and B share
    [5], returns (1, 0), A^S = (1/2, -1/2); C's second step is alone, A^S = 0.
    The lone trajectory of group h gets 0 everywhere."""
    out = GiGPO(omega=1.0, gamma=0.5, normalize="none").apply(
        context(), table(EPISODES, REWARDS, GROUPS)).table
    got = out.column(TURN_ADVANTAGES).to_pylist()
    want = [[None, 1 / 3 + 1 / 6, None, 1 / 3 + 1 / 2],
            [None, -2 / 3 - 1 / 3, None, -2 / 3 - 1 / 2],
            [None, 1 / 3 + 1 / 6, None, 1 / 3],
            [None, 0.0, None, 0.0]]
    for g, w in zip(got, want):
        assert [v is None for v in g] == [v is None for v in w]
        assert [v for v in g if v is not None] == pytest.approx([v for v in w if v is not None])


def test_golden_std_normalised_with_omega():
    """normalize='std' (sample std + 1e-6): rewards (1, 0, 1) have std sqrt(1/3), so
    A^E = (1/sqrt3, -2/sqrt3, 1/sqrt3); first-step returns (.5, 0, .5) likewise give
    (1/sqrt3, -2/sqrt3, 1/sqrt3); second-step returns (1, 0) give (1/sqrt2, -1/sqrt2);
    omega = 0.5 weighs the step level."""
    r3, r2 = 3 ** -0.5, 2 ** -0.5
    out = GiGPO(omega=0.5, gamma=0.5).apply(context(), table(EPISODES, REWARDS, GROUPS)).table
    got = out.column(TURN_ADVANTAGES).to_pylist()
    assert got[0][1] == pytest.approx(r3 + 0.5 * r3, rel=1e-5)
    assert got[0][3] == pytest.approx(r3 + 0.5 * r2, rel=1e-5)
    assert got[1][1] == pytest.approx(-2 * r3 - 0.5 * 2 * r3, rel=1e-5)
    assert got[1][3] == pytest.approx(-2 * r3 - 0.5 * r2, rel=1e-5)
    assert got[2][3] == pytest.approx(r3, rel=1e-5)


def test_a_state_met_twice_in_one_trajectory_counts_each_time():
    """A and B answer [5] twice; with gamma 1 and R = (1, 0) every return is R, so each of
    the four steps after [5] is in one anchor group of mean 1/2: A^S = +-1/2."""
    eps = [episode(10, 11, [5], third=12), episode(13, 14, [5], third=15)]
    out = GiGPO(gamma=1.0, normalize="none").apply(
        context(), table(eps, [1.0, 0.0], ["g", "g"])).table
    a, b = out.column(TURN_ADVANTAGES).to_pylist()
    assert [a[3], a[5], b[3], b[5]] == pytest.approx([1.0, 1.0, -1.0, -1.0])
    assert a[1] == pytest.approx(1.0) and b[1] == pytest.approx(-1.0)  # 1/2 + 1/2


def test_dropped_and_unscored_rows_get_no_advantage_and_do_not_count():
    out = GiGPO(normalize="none", gamma=0.5).apply(
        context(), table(EPISODES[:3] + [EPISODES[0]], [1.0, 0.0, 1.0, None], ["g"] * 4,
                         kept=[True, True, False, True])).table
    got = out.column(TURN_ADVANTAGES).to_pylist()
    assert got[2] is None and got[3] is None
    assert got[0][1] == pytest.approx(0.5 + 0.25)  # A^E 1/2; first returns (.5, 0): 1/4


def test_step_rewards_put_the_unaccounted_return_on_the_last_step():
    turns = episode(10, 11, [5])
    turns[2]["reward"] = 0.2  # the environment's answer to the first step
    assert step_rewards(turns, 1.0) == pytest.approx([0.2, 0.8])
    assert discounted([0.2, 0.8], 0.5) == pytest.approx([0.6, 0.8])
