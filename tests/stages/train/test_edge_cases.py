"""Edge cases of the GRPO-family maths that an independent check against the papers found
(issue 13): each of these failed before its fix."""

import numpy as np
import pytest
import torch

from stages.train.advantages import lookup_advantage
from stages.train.grpo import GRPO
from stages.train.loss import k3_kl, policy_loss
from tests.stages.train.conftest import TINY, rollouts

SHIFT_INVARIANT = ["grpo", "drgrpo", "rloo", "mc_grpo"]


@pytest.mark.parametrize("name", SHIFT_INVARIANT)
@pytest.mark.parametrize("shift", [1.0, 1e3, 1e6])
def test_adding_a_constant_leaves_the_advantages_alone(name, shift):
    rewards = np.array([0.0, 0.5, 1.0, 1.0, 2.0, 2.0, 2.0])
    groups = np.array([0, 0, 0, 0, 1, 1, 1])
    fn = lookup_advantage(name)
    base = fn(rewards, groups)
    assert np.any(base != 0)
    np.testing.assert_allclose(fn(rewards + shift, groups), base, rtol=1e-6, atol=1e-9)


def _tokens(logprobs, dtype=torch.float32):
    return torch.tensor(logprobs, dtype=dtype)


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean", "seq_mean_token_sum_norm"])
def test_minus_inf_logprobs_at_masked_positions_give_no_nan(aggregation):
    # padded positions hold -inf (new and old, and the reference): masked, so ignored
    new = _tokens([[-0.5, -float("inf")], [-1.0, -0.7]]).requires_grad_(True)
    old = _tokens([[-0.6, -float("inf")], [-1.1, -float("inf")]])
    ref = _tokens([[-0.4, -float("inf")], [-0.9, -float("inf")]])
    mask = torch.tensor([[True, False], [True, False]])
    entropy = _tokens([[0.3, float("nan")], [0.2, float("inf")]])
    loss, stats = policy_loss(new, old, _tokens([1.0, -1.0]), mask, aggregation=aggregation,
                              ref_logprobs=ref, kl_coef=0.1, entropy=entropy,
                              entropy_coef=0.01)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(new.grad).all()
    assert new.grad[:, 1].tolist() == [0.0, 0.0]
    assert all(np.isfinite(v) for v in stats.values())
    assert torch.isfinite(k3_kl(new, ref, mask)).all()


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_an_overflowing_ratio_on_a_clipped_token_has_zero_gradient_in_float32(level):
    # log ratio 100: exp overflows float32; with A > 0 the clipped term is active, so the
    # token's PPO gradient is 0 (was: inf * 0 = nan)
    new = _tokens([[100.0, 0.0]]).requires_grad_(True)
    old = _tokens([[0.0, 0.0]])
    mask = torch.tensor([[True, False]])
    loss, _ = policy_loss(new, old, _tokens([1.0]), mask, ratio_level=level)
    loss.backward()
    assert torch.isfinite(loss)
    assert new.grad.tolist() == [[0.0, 0.0]]
    assert loss.item() == pytest.approx(-1.2)  # -clip(rho, 0.8, 1.2) * A


@pytest.mark.parametrize("weights", [[1.0, float("nan")], [float("inf"), 1.0]])
def test_gdpo_refuses_non_finite_weights(weights):
    comps = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.0, 0.0]])
    with pytest.raises(ValueError, match="weights must be finite"):
        lookup_advantage("gdpo")(comps.sum(1), np.array([0, 0, 1, 1]), comps, weights=weights)


def test_zero_advantage_rows_keep_their_kl_term():
    # a flat batch: no policy-gradient signal, but with kl_coef > 0 its rows still carry
    # the KL gradient (was: dropped before the loss, so a KL-only batch never moved)
    policy = TINY.build(seed=0)
    batch = rollouts(policy, [1.0] * 4, ["a"] * 4, completions=["123", "9", "12", "14"])
    kept = GRPO(kl_coef=0.5).learner(policy, seed=0).update(None, batch)
    assert kept.advantages == [0.0] * 4 and kept.metrics["n_seqs"] == 4
    assert "kl_ref" in kept.metrics
    plain = GRPO().learner(TINY.build(seed=0), seed=0).update(None, batch)
    assert plain.metrics["n_seqs"] == 0
