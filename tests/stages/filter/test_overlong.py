"""DAPO overlong handling: drop truncated rollouts, or the soft length penalty."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from gfcr.core.pipeline import PipelineError
from gfcr.core.rollout import col
from gfcr.launch.run import execute
from stages import GroupSample, Overlong, UniformSampler, Verify
from stages.filter.overlong import length_penalty
from tests.conftest import tiny_pipeline
from tests.resources.rollouts import context, kept_after, rollouts


def test_drop_mode_drops_exactly_the_truncated():
    table = rollouts(["g"] * 3, [1.0, 0.0, 1.0], finish_reason=["stop", "length", "stop"])
    result = Overlong().apply(context(), table)
    assert result.keep == [True, False, True] and result.reason == "truncated"


def test_penalty_follows_dapo_formula():
    # L = 10, B = 4: 0 up to 6 tokens, then -1/4 per token, -1 from 10 on
    lengths = np.array([5, 6, 7, 8, 10, 12])
    assert length_penalty(lengths, 10, 4).tolist() == [0.0, 0.0, -0.25, -0.5, -1.0, -1.0]


def test_penalty_is_added_to_reward_and_recorded():
    table = rollouts(["g"] * 4, [1.0, 1.0, 0.0, None], completion=["x" * 5, "x" * 8, "x" * 12, "x" * 9],
                     rewards=[[("verify", 1.0)], [("verify", 1.0)], [("verify", 0.0)], None])
    stage = Overlong(mode="penalty", max_tokens=10, buffer=4)
    result = stage.apply(context(), table)
    assert result.keep is None
    assert result.table.column(col.REWARD).to_pylist() == [1.0, 0.5, -1.0, None]
    assert result.table.column(col.REWARDS).to_pylist()[1] == [("verify", 1.0), ("overlong", -0.5)]
    assert kept_after(stage, table) == [True] * 4


def test_penalty_needs_lengths_and_a_verifier_upstream(pipeline):
    with pytest.raises(ValidationError, match="needs max_tokens and buffer"):
        Overlong(mode="penalty")
    with pytest.raises(ValidationError, match="buffer=20 exceeds max_tokens=10"):
        Overlong(mode="penalty", max_tokens=10, buffer=20)
    s = list(pipeline.stages)
    with pytest.raises(PipelineError, match="'overlong' reads column 'reward'"):
        tiny_pipeline(stages=[s[0], s[1], Overlong(mode="penalty", max_tokens=6, buffer=2),
                              s[2], s[4]])
    tiny_pipeline(stages=[s[0], s[1], Overlong(), s[2], s[4]])  # dropping needs no reward


def test_truncated_rollouts_are_dropped_in_the_loop_and_stored(tmp_path):
    p = tiny_pipeline(steps=1, stages=[UniformSampler(batch=4), GroupSample(n=4, max_tokens=2),
                                       Overlong(), Verify()])
    summary = execute(p, root=tmp_path, executor="local")
    (m,) = summary.history
    assert m["dropped/overlong"] > 0  # an untrained model rarely stops within 2 tokens
    assert m["kept"] + m["dropped/overlong"] <= m["rollouts"]
