"""Dynamic sampling: zero-variance groups under float noise, continuous rewards, refill."""

from __future__ import annotations

import numpy as np
import pytest

from gfcr.launch.run import execute
from stages import GRPO, DynamicSampling, GroupSample, UniformSampler, Verify
from stages.filter.dynamic import zero_variance_groups
from tests.conftest import tiny_pipeline
from tests.resources.digits import Digits


def _flat(groups, rewards, kept=None):
    kept = np.ones(len(rewards), bool) if kept is None else np.asarray(kept)
    return zero_variance_groups(groups, np.asarray(rewards, float), kept, atol=1e-6, rtol=1e-6)


def test_float_noise_does_not_let_a_constant_group_through():
    # std != 0 would keep this group (NeMo-RL #4158)
    assert _flat(["g"] * 3, [0.1 + 1e-9, 0.1, 0.1 - 1e-9]) == {"g"}
    assert np.std([0.1 + 1e-9, 0.1, 0.1 - 1e-9]) != 0


def test_continuous_rewards_are_judged_by_spread_not_mean():
    # a mean-range filter lets [0.5, 0.5] through and drops nothing useful (OpenRLHF #1272)
    assert _flat(["a", "a", "b", "b"], [0.5, 0.5, 0.3, 0.7]) == {"a"}


def test_groups_are_judged_on_their_own_rows_not_leave_one_out():
    # [1,0,0,0] has signal; a LOO baseline would turn it into all zeros (NeMo-RL #3469)
    assert _flat(["g"] * 4, [1, 0, 0, 0]) == set()


def test_rows_dropped_earlier_and_unscored_rows_do_not_count():
    assert _flat(["g"] * 3, [1.0, 0.0, 0.0], kept=[False, True, True]) == {"g"}
    assert _flat(["g"] * 3, [1.0, np.nan, 1.0]) == {"g"}
    assert _flat(["g", "h", "h"], [1.0, 0.0, 1.0]) == {"g"}  # a single rollout: no signal


def test_refill_needs_a_target():
    with pytest.raises(ValueError, match="min_groups"):
        DynamicSampling(mode="refill")


def test_refill_draws_more_prompts_until_the_batch_is_full(tmp_path):
    p = tiny_pipeline(task=Digits(), stages=[
        UniformSampler(batch=4), GroupSample(n=4, max_tokens=1), Verify(),
        DynamicSampling(mode="refill", min_groups=4, max_rounds=5), GRPO()])
    summary = execute(p, root=tmp_path, executor="local")
    for m in summary.history:
        assert m["rounds"] > 1  # one-token answers: most groups are flat
        assert m["kept_groups"] >= 4 or m["rounds"] == 6
        assert m["rollouts"] > 16  # extra prompts were generated, and stored
    filtered = execute(p.with_overrides(["dynamic_sampling.mode=filter"]), root=tmp_path,
                       executor="local")
    assert all(m["rounds"] == 1 for m in filtered.history)
    assert sum(m["kept_groups"] for m in summary.history) > \
        sum(m["kept_groups"] for m in filtered.history)
