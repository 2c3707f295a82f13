"""Golden values and a gradient check for the clipped policy-gradient loss."""

import math

import pytest
import torch

from stages.train.loss import policy_loss


def _case(ratios, advantages, width=2):
    """Sequences with the given per-token ratios (old logprob 0, new log r), right-padded."""
    new = torch.zeros(len(ratios), width, dtype=torch.float64)
    mask = torch.zeros(len(ratios), width, dtype=torch.bool)
    for i, row in enumerate(ratios):
        new[i, :len(row)] = torch.log(torch.tensor(row, dtype=torch.float64))
        mask[i, :len(row)] = True
    return new, torch.zeros_like(new), torch.tensor(advantages, dtype=torch.float64), mask


# seq 0 (A=+1): r=1.5 -> clipped at 1.2 (high side), r=0.9 -> unclipped
# seq 1 (A=-2): r=0.5 -> clipped at 0.8 (low side): -min(-1.0, -1.6) = 1.6
# per-token losses: -1.2, -0.9 | 1.6
GOLDEN = ([[1.5, 0.9], [0.5]], [1.0, -2.0])


def test_token_mean_golden():
    loss, stats = policy_loss(*_case(*GOLDEN), aggregation="token_mean")
    assert loss.item() == pytest.approx((-1.2 - 0.9 + 1.6) / 3)
    assert stats["clip_frac"] == pytest.approx(2 / 3)
    kl = [r - 1 - math.log(r) for r in (1.5, 0.9, 0.5)]
    assert stats["approx_kl"] == pytest.approx(sum(kl) / 3)
    assert stats["ratio_mean"] == pytest.approx((1.5 + 0.9 + 0.5) / 3)


def test_seq_mean_golden():
    loss, _ = policy_loss(*_case(*GOLDEN), aggregation="seq_mean")
    assert loss.item() == pytest.approx(((-1.2 - 0.9) / 2 + 1.6) / 2)


def test_clip_higher_widens_the_upper_side_only():
    loss, stats = policy_loss(*_case(*GOLDEN), clip_low=0.2, clip_high=0.6,
                              aggregation="token_mean")
    assert loss.item() == pytest.approx((-1.5 - 0.9 + 1.6) / 3)  # 1.5 < 1.6: not clipped
    assert stats["clip_frac"] == pytest.approx(1 / 3)


def test_pessimistic_side_is_never_clipped():
    # A>0 with r below 1-eps and A<0 with r above 1+eps keep the unclipped term (and grad)
    new, old, adv, mask = _case([[0.5], [1.5]], [1.0, -1.0], width=1)
    new.requires_grad_(True)
    loss, stats = policy_loss(new, old, adv, mask, aggregation="token_mean")
    assert loss.item() == pytest.approx((-0.5 + 1.5) / 2)
    assert stats["clip_frac"] == 0.0
    loss.backward()
    assert new.grad[:, 0].tolist() == pytest.approx([-0.5 / 2, 1.5 / 2])


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean"])
def test_gradient_matches_finite_differences(aggregation):
    gen = torch.Generator().manual_seed(0)
    old = -torch.rand(3, 4, generator=gen, dtype=torch.float64)
    new = (old + 0.4 * torch.randn(3, 4, generator=gen, dtype=torch.float64))
    adv = torch.tensor([1.3, -0.7, 0.4], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]], dtype=torch.bool)

    def f(x):
        return policy_loss(x, old, adv, mask, clip_low=0.2, clip_high=0.28,
                           aggregation=aggregation)[0]

    assert torch.autograd.gradcheck(f, (new.clone().requires_grad_(True),), eps=1e-6,
                                    atol=1e-6)


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean"])
def test_micro_batches_add_up_to_the_full_batch(aggregation):
    new, old, adv, mask = _case([[1.1, 0.7], [0.95], [1.4, 1.0]], [0.5, -1.0, 2.0])
    full, _ = policy_loss(new, old, adv, mask, aggregation=aggregation)
    denominator = 5.0 if aggregation == "token_mean" else 3.0
    parts = [policy_loss(new[s], old[s], adv[s], mask[s], aggregation=aggregation,
                         denominator=denominator)[0] for s in (slice(0, 1), slice(1, 3))]
    assert sum(parts).item() == pytest.approx(full.item())


def test_seq_mean_skips_empty_sequences():
    new, old, adv, mask = _case([[1.0], []], [1.0, 1.0])
    loss, _ = policy_loss(new, old, adv, mask, aggregation="seq_mean")
    assert loss.item() == pytest.approx(-1.0)


def test_shape_and_aggregation_errors():
    new, old, adv, mask = _case(*GOLDEN)
    with pytest.raises(ValueError, match="must match"):
        policy_loss(new, old[:, :1], adv, mask)
    with pytest.raises(ValueError, match="one entry per sequence"):
        policy_loss(new, old, adv[:1], mask)
    with pytest.raises(ValueError, match="'sum'"):
        policy_loss(new, old, adv, mask, aggregation="sum")  # type: ignore[arg-type]
