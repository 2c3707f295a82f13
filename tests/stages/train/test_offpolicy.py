"""Off-policy correction: decoupled PPO with truncated importance weights for stale rows."""

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from stages.train.advantages import lookup_advantage
from stages.train.grpo import GRPO
from tests.stages.train.conftest import TINY, grads, params, rollouts

REWARDS = [1.0, 0.0, 0.2, 0.7]
GROUPS = ["a", "a", "b", "b"]
LONG = ["123", "9", "12", "14"]  # + EOS: 4, 2, 3, 3 tokens
ADV = lookup_advantage("grpo")(np.array(REWARDS), np.array(GROUPS))


def _ctx(version, step=0):
    return SimpleNamespace(policy_version=version, step=step)


def test_on_policy_batch_has_weights_one_and_the_uncorrected_loss():
    results = []
    for cap in (2.0, None):
        policy = TINY.build(seed=0)
        batch = rollouts(policy, REWARDS, GROUPS, completions=LONG,
                         policy_version_start=[3] * 4, replay_count=[0] * 4)
        learner = GRPO(tis_cap=cap).learner(policy, seed=0)
        work = learner.prepare(_ctx(3), batch, ADV)
        assert work.weights is None  # no off-policy row: no weights, no extra forward
        loss = learner.loss_and_gradients(_ctx(3), batch)
        results.append((loss, grads(policy.model),
                        learner.update(_ctx(3), batch).metrics, params(policy.model)))
    (loss_a, grad_a, m, after_a), (loss_b, grad_b, _, after_b) = results
    assert loss_a == loss_b
    assert all(torch.equal(a, b) for a, b in zip(grad_a, grad_b))
    assert all(torch.equal(a, b) for a, b in zip(after_a, after_b))
    assert m["offpolicy_share"] == 0.0 and m["is_weight_mean"] == 1.0
    assert m["is_truncated_share"] == 0.0 and m["staleness_max"] == 0.0


def test_stale_rows_get_hand_computed_truncated_weights():
    policy = TINY.build(seed=0)
    # behaviour logprob = current - delta, so pi_prox / pi_behav = exp(delta) per token
    deltas = [[0.5, 1.0, -0.2, 0.0], [0.3, 0.3], [0.1, 2.0, -1.0], [0.0, 0.0, 0.0]]
    batch = rollouts(policy, REWARDS, GROUPS, completions=LONG, shift=deltas,
                     policy_version_start=[1, 3, 0, 3], replay_count=[0, 0, 0, 0])
    learner = GRPO(tis_cap=2.0).learner(policy, seed=0)
    work = learner.prepare(_ctx(3), batch, ADV)
    want = {0: [math.exp(0.5), 2.0, math.exp(-0.2), 1.0], 2: [math.exp(0.1), 2.0, math.exp(-1.0)]}
    for i in range(4):
        expected = want.get(i, [1.0] * len(deltas[i]))  # fresh rows: exactly 1
        assert work.weights[i] == pytest.approx(expected, rel=1e-5)
        if i not in want:
            assert np.all(work.weights[i] == 1.0)
    # the ratio of a stale row is taken against the proximal (current) logprobs
    behaviour = batch.column("logprobs").to_pylist()
    assert work.old[0] == pytest.approx(np.array(behaviour[0]) + np.array(deltas[0]), abs=1e-5)
    assert work.old[1] == pytest.approx(behaviour[1])
    m = learner.update(_ctx(3), batch).metrics
    assert m["offpolicy_share"] == 0.5
    assert m["staleness_mean"] == 2.5 and m["staleness_max"] == 3.0
    assert m["is_truncated_share"] == pytest.approx(2 / 7)
    off = np.concatenate([want[0], want[2]])
    assert m["is_weight_mean"] == pytest.approx(off.mean(), rel=1e-5)
    assert m["approx_kl"] < 0.2  # the fresh rows' ratio is 1; stale rows are at 1 vs prox


def test_decoupled_loss_is_the_weighted_ppo_loss_against_the_proximal_policy():
    """One stale row: the loss equals -w * A * rho averaged per sequence, rho = 1 at the
    proximal weights, so the loss is -mean_t(w_t) * A."""
    policy = TINY.build(seed=0)
    deltas = [[0.4, -0.3, 0.9, 0.2], [0.0, 0.0], [0.0] * 3, [0.0] * 3]
    batch = rollouts(policy, REWARDS[:2], GROUPS[:2], completions=LONG, shift=deltas,
                     policy_version_start=[0, 0])
    learner = GRPO(tis_cap=2.0).learner(policy, seed=0)
    loss = learner.loss_and_gradients(_ctx(1), batch)
    adv = lookup_advantage("grpo")(np.array(REWARDS[:2]), np.array(GROUPS[:2]))
    w0 = np.minimum(np.exp(deltas[0]), 2.0).mean()
    assert loss == pytest.approx(-(w0 * adv[0] + 1.0 * adv[1]) / 2, rel=1e-5)


def test_replayed_rows_are_off_policy_at_any_version_and_cap_none_turns_it_off():
    policy = TINY.build(seed=0)
    batch = rollouts(policy, REWARDS, GROUPS, completions=LONG,
                     shift=[[0.5] * 4] * 4, policy_version_start=[0] * 4,
                     replay_count=[1, 0, 0, 0])
    m = GRPO().learner(policy, seed=0).update(_ctx(0), batch).metrics
    assert m["offpolicy_share"] == 0.25 and m["staleness_max"] == 0.0
    assert m["is_weight_mean"] == pytest.approx(math.exp(0.5), rel=1e-5)
    work = GRPO(tis_cap=None).learner(policy, seed=0).prepare(_ctx(5), batch, ADV)
    assert work.weights is None
    assert work.old[0] == pytest.approx(batch.column("logprobs").to_pylist()[0])


def test_version_defaults_to_the_policy_version_without_a_context():
    policy = TINY.build(seed=0)
    policy.version = 2
    batch = rollouts(policy, REWARDS, GROUPS, completions=LONG,
                     policy_version_start=[2, 2, 1, 2])
    m = GRPO().learner(policy, seed=0).update(None, batch).metrics
    assert m["offpolicy_share"] == 0.25 and m["staleness_mean"] == 1.0
