"""gfcr.core.trajectory: the rollout's one body, and its flat columns derived in one way
(per trajectory and vectorised over a ``turns`` column, which must agree)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from gfcr.core.trajectory import TURNS_TYPE, Exchange, Trajectory, branches, flat
from gfcr.core.turncols import flat_columns, single_turns


def _episode() -> Trajectory:
    traj = Trajectory().start_ids([1, 2, 3])
    traj.force([4, 5], [-0.5, -0.25]).add_policy([6, 7], [-1.0, -2.0])
    traj.add_observation([8], "tool", tool_name="python", tool_error="timeout")
    return traj.add_policy([9], [-3.0])


def test_the_flat_columns_follow_the_one_rule() -> None:
    traj = _episode()
    got = traj.flat()
    assert got.prompt_ids == [1, 2, 3]
    assert got.completion_ids == [4, 5, 6, 7, 8, 9]
    assert got.logprobs == [-0.5, -0.25, -1.0, -2.0, 0.0, -3.0]
    assert got.loss_mask == [False, False, True, True, False, True]
    assert [t.source for t in traj.turns] == ["environment", "forced", "policy", "tool",
                                              "policy"]
    assert traj.forced_tokens() == 2 and traj.policy_tokens() == 3


def test_the_vectorised_columns_agree_with_the_per_trajectory_rule() -> None:
    rows = [_episode().rows(), None, Trajectory().start_ids([5]).add_policy([], []).rows(),
            [], Trajectory().start_ids([]).add_policy([3], [-0.1]).rows()]
    prompt, completion, logprobs = flat_columns(pa.chunked_array(
        [pa.array(rows[:2], TURNS_TYPE), pa.array(rows[2:], TURNS_TYPE)]))
    for i, turns in enumerate(rows):
        if turns is None:
            assert not prompt[i].is_valid and not completion[i].is_valid
            continue
        want = flat(turns)
        assert prompt[i].as_py() == want.prompt_ids
        assert completion[i].as_py() == want.completion_ids
        assert logprobs[i].as_py() == pytest.approx(want.logprobs)


def test_a_turn_with_logprobs_not_one_per_token_is_refused_naming_its_row() -> None:
    bad = _episode().rows()
    bad[2]["logprobs"] = [-1.0]
    with pytest.raises(ValueError, match="row 1: turn 2 has 1 logprobs for 2 tokens"):
        flat_columns(pa.array([_episode().rows(), bad], TURNS_TYPE))


def test_single_turns_and_flat_columns_are_inverse() -> None:
    prompts = pa.array([[1, 2], [3], [4, 5, 6]], pa.list_(pa.int32()))
    completions = pa.array([[7, 8, 9], [], [10]], pa.list_(pa.int32()))
    lps = pa.array([[-1.0, -2.0, -3.0], [], [-4.0]], pa.list_(pa.float32()))
    turns = single_turns(prompts, completions, lps, np.array([1, 0, 0]))
    back = flat_columns(turns)
    assert [a.to_pylist() for a in back] == [prompts.to_pylist(), completions.to_pylist(),
                                             lps.to_pylist()]
    assert flat(turns[0].as_py()).loss_mask == [False, True, True]


def test_fork_copies_the_turns_it_keeps() -> None:
    traj = _episode()
    branch = traj.fork(3)
    branch.add_policy([11], [-0.5])
    assert len(traj.turns) == 5 and branch.ids() == [1, 2, 3, 4, 5, 6, 7, 11]
    branch.turns[0].token_ids.append(0)
    assert traj.turns[0].token_ids == [1, 2, 3]
    with pytest.raises(ValueError, match="cannot fork at turn 0"):
        traj.fork(0)


def test_calls_become_one_trajectory_per_branch() -> None:
    calls = [Exchange([1, 2], [3], [-1.0]),
             Exchange([1, 2, 3, 4], [5], [-2.0], role="tool", tool_names=("calc",)),
             Exchange([1, 2, 9], [6], [-3.0])]  # extends neither: a branch of the first
    got = branches(calls)
    assert [(b.parent, b.calls) for b in got] == [(None, [0, 1]), (0, [2])]
    first = got[0].trajectory.rows()
    assert [t["source"] for t in first] == ["environment", "policy", "tool", "policy"]
    assert first[2]["token_ids"] == [4] and first[2]["tool_name"] == "calc"
    assert got[1].trajectory.prompt_ids == [1, 2, 9]
