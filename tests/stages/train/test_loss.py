"""Golden values and a gradient check for the clipped policy-gradient loss."""

import math

import pytest
import torch

from stages.engines.tiny import TinyLlama
from stages.train.grpo import sequence_logprobs
from stages.train.loss import k3_kl, policy_loss, token_entropy, truncated_is_weights

AGGREGATIONS = ["token_mean", "seq_mean", "seq_mean_token_sum_norm"]


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


VARIANTS = {
    "plain": {},
    "kl": {"kl_coef": 0.3},
    "gspo": {"ratio_level": "sequence", "clip_low": 0.02, "clip_high": 0.03},
    "is_kl_entropy": {"kl_coef": 0.1, "entropy_coef": 0.05, "is": True},
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_gradient_matches_finite_differences(aggregation, variant):
    gen = torch.Generator().manual_seed(0)
    old = -torch.rand(3, 4, generator=gen, dtype=torch.float64)
    new = (old + 0.4 * torch.randn(3, 4, generator=gen, dtype=torch.float64))
    ref = old + 0.3 * torch.randn(3, 4, generator=gen, dtype=torch.float64)
    entropy = torch.rand(3, 4, generator=gen, dtype=torch.float64)
    adv = torch.tensor([1.3, -0.7, 0.4], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]], dtype=torch.bool)
    options = {"clip_low": 0.2, "clip_high": 0.28, **VARIANTS[variant]}
    if options.pop("is", False):
        options["is_weights"] = 0.5 + torch.rand(3, 4, generator=gen, dtype=torch.float64)
    if "kl_coef" in options:
        options["ref_logprobs"] = ref
    if "entropy_coef" in options:
        options["entropy"] = entropy

    def f(x):
        return policy_loss(x, old, adv, mask, aggregation=aggregation, max_tokens=6,
                           **options)[0]

    x = new.clone().requires_grad_(True)
    assert torch.autograd.gradcheck(f, (x,), eps=1e-6, atol=1e-7, rtol=1e-5)
    f(x).backward()
    assert x.grad[mask].abs().sum() > 0 and torch.all(x.grad[~mask] == 0)


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_micro_batches_add_up_to_the_full_batch(aggregation):
    new, old, adv, mask = _case([[1.1, 0.7], [0.95], [1.4, 1.0]], [0.5, -1.0, 2.0])
    full, _ = policy_loss(new, old, adv, mask, aggregation=aggregation, max_tokens=4)
    denominator = 5.0 if aggregation == "token_mean" else 3.0
    # the middle micro-batch's longest sequence is 1 token, the batch's 2: a fixed
    # max_tokens is what makes seq_mean_token_sum_norm independent of the split
    parts = [policy_loss(new[s], old[s], adv[s], mask[s], aggregation=aggregation,
                         denominator=denominator, max_tokens=4)[0]
             for s in (slice(0, 1), slice(1, 2), slice(2, 3))]
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


# ------------------------------------------------------------------ aggregation weights

def _long_and_short():
    """ratio 1 everywhere: a 4-token sequence with A=+1 (per-token loss -1) and a 1-token
    sequence with A=-1 (per-token loss +1); the gradient of a token is -A times its
    aggregation weight."""
    new, old, adv, mask = _case([[1.0] * 4, [1.0]], [1.0, -1.0], width=4)
    return new.requires_grad_(True), old, adv, mask


@pytest.mark.parametrize("aggregation, max_tokens, value, long_w, short_w", [
    # all 5 tokens weigh 1/5: (-4 + 1) / 5
    ("token_mean", None, -0.6, 1 / 5, 1 / 5),
    # each sequence weighs 1/2 and its tokens share it: (-4/4 + 1/1) / 2
    ("seq_mean", None, 0.0, 1 / 8, 1 / 2),
    # token sums over the constant 8, then mean over 2 sequences: (-4/8 + 1/8) / 2
    ("seq_mean_token_sum_norm", 8, -3 / 16, 1 / 16, 1 / 16),
    # no max_tokens: the batch's longest sequence (4): (-4/4 + 1/4) / 2
    ("seq_mean_token_sum_norm", None, -3 / 8, 1 / 8, 1 / 8),
])
def test_aggregation_weighs_a_long_and_a_short_sequence(aggregation, max_tokens, value,
                                                       long_w, short_w):
    new, old, adv, mask = _long_and_short()
    loss, _ = policy_loss(new, old, adv, mask, aggregation=aggregation, max_tokens=max_tokens)
    assert loss.item() == pytest.approx(value, abs=1e-12)
    loss.backward()
    assert new.grad[0].tolist() == pytest.approx([-long_w] * 4, abs=1e-12)
    assert new.grad[1].tolist() == pytest.approx([short_w, 0, 0, 0], abs=1e-12)


# ----------------------------------------------------------------------- clip-higher

def test_clip_higher_asymmetry_positive_at_high_negative_at_low():
    # clip_low 0.1, clip_high 0.3; one token per sequence, token_mean over 6
    #  A=+1 r=1.5 -> clipped at 1 + 0.3: -1.3 (no grad)   A=+1 r=1.2 -> -1.2
    #  A=-1 r=0.8 -> clipped at 1 - 0.1: +0.9 (no grad)   A=-1 r=0.95 -> +0.95
    #  A=+1 r=0.5 -> pessimistic side: -0.5               A=-1 r=1.5 -> +1.5
    ratios = [[1.5], [1.2], [0.8], [0.95], [0.5], [1.5]]
    new, old, adv, mask = _case(ratios, [1.0, 1.0, -1.0, -1.0, 1.0, -1.0], width=1)
    new.requires_grad_(True)
    loss, stats = policy_loss(new, old, adv, mask, clip_low=0.1, clip_high=0.3,
                              aggregation="token_mean")
    assert loss.item() == pytest.approx((-1.3 - 1.2 + 0.9 + 0.95 - 0.5 + 1.5) / 6)
    assert stats["clip_frac"] == pytest.approx(2 / 6)
    loss.backward()  # d(-r A)/d log r = -r A, over 6
    assert new.grad[:, 0].tolist() == pytest.approx(
        [0.0, -1.2 / 6, 0.0, 0.95 / 6, -0.5 / 6, 1.5 / 6], abs=1e-12)


# ------------------------------------------------------------------------------ GSPO

def test_gspo_sequence_ratio_is_clipped_per_sequence():
    e = math.exp
    # seq 0, A=+1, token ratios 2 and 0.5: s = exp((ln 2 + ln 0.5)/2) = 1, unclipped
    #   (token level would clip the 2 at 1.0004 instead)
    # seq 1, A=+1, three tokens exp(0.001): s = exp(0.001) > 1 + 4e-4 -> -1.0004, no grad
    # seq 2, A=-1, exp(-0.002), exp(0): s = exp(-0.001) < 1 - 3e-4 -> +0.9997, no grad
    # seq 3, A=+1, exp(0.0002), exp(-0.0001): s = exp(0.00005), inside -> -s
    ratios = [[2.0, 0.5], [e(0.001)] * 3, [e(-0.002), 1.0], [e(0.0002), e(-0.0001)]]
    new, old, adv, mask = _case(ratios, [1.0, 1.0, -1.0, 1.0], width=3)
    new.requires_grad_(True)
    loss, stats = policy_loss(new, old, adv, mask, clip_low=3e-4, clip_high=4e-4,
                              ratio_level="sequence", aggregation="seq_mean")
    s3 = e(0.00005)
    assert loss.item() == pytest.approx((-1.0 - 1.0004 + 0.9997 - s3) / 4, abs=1e-12)
    assert stats["clip_frac"] == pytest.approx(5 / 9)  # tokens of seqs 1 and 2
    # ratio_mean: token-weighted s: (2 * 1 + 3 e^0.001 + 2 e^-0.001 + 2 s3) / 9
    assert stats["ratio_mean"] == pytest.approx(
        (2 + 3 * e(0.001) + 2 * e(-0.001) + 2 * s3) / 9, abs=1e-12)
    loss.backward()
    # d(-s A)/d logp_t = -s A / |y| for every token of the sequence, over 4 sequences
    assert new.grad[0].tolist() == pytest.approx([-1 / 8, -1 / 8, 0.0], abs=1e-12)
    assert new.grad[1].tolist() == [0.0, 0.0, 0.0]
    assert new.grad[2].tolist() == [0.0, 0.0, 0.0]
    assert new.grad[3].tolist() == pytest.approx([-s3 / 8, -s3 / 8, 0.0], abs=1e-12)


def test_token_level_differs_from_sequence_level_on_the_same_batch():
    new, old, adv, mask = _case([[2.0, 0.5]], [1.0])
    token, _ = policy_loss(new, old, adv, mask, clip_low=0.2, clip_high=0.2)
    seq, _ = policy_loss(new, old, adv, mask, clip_low=0.2, clip_high=0.2,
                         ratio_level="sequence")
    assert token.item() == pytest.approx((-1.2 - 0.5) / 2)  # 2 clipped at 1.2
    assert seq.item() == pytest.approx(-1.0)                # geometric mean 1


# -------------------------------------------------------------------------- k3 / KL

def test_k3_golden_nonnegative_and_zero_at_equality():
    # x = log(ref/new): x = ln 2 -> 2 - ln 2 - 1; x = ln 0.5 -> 0.5 + ln 2 - 1; x = 0 -> 0
    new = torch.tensor([[0.0, 0.0], [-1.0, 0.0]], dtype=torch.float64)
    ref = torch.tensor([[math.log(2), math.log(0.5)], [-1.0, 5.0]], dtype=torch.float64)
    mask = torch.tensor([[True, True], [True, False]])
    k = k3_kl(new, ref, mask)
    assert k.flatten().tolist() == pytest.approx(
        [1 - math.log(2), math.log(2) - 0.5, 0.0, 0.0], abs=1e-15)
    gen = torch.Generator().manual_seed(1)
    a = torch.randn(64, 8, generator=gen, dtype=torch.float64) * 3
    b = torch.randn(64, 8, generator=gen, dtype=torch.float64) * 3
    full = torch.ones(64, 8, dtype=torch.bool)
    assert torch.all(k3_kl(a, b, full) >= 0)
    assert torch.all(k3_kl(a, a, full) == 0)


@pytest.mark.parametrize("aggregation, kl_mean", [
    # token k3 values k0 = 1 - ln 2, k1 = ln 2 - 0.5 | k2 = 0; k0 + k1 = 1/2
    ("token_mean", 0.5 / 3),
    ("seq_mean", (0.5 / 2 + 0.0) / 2),
])
def test_kl_penalty_is_aggregated_like_the_pg_term(aggregation, kl_mean):
    # A = 0: the pg term vanishes and the loss is kl_coef times the aggregated k3
    new = torch.tensor([[0.0, 0.0], [-1.0, 0.0]], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([[math.log(2), math.log(0.5)], [-1.0, 0.0]], dtype=torch.float64,
                       requires_grad=True)  # frozen: no gradient reaches it
    mask = torch.tensor([[True, True], [True, False]])
    adv = torch.zeros(2, dtype=torch.float64)
    loss, stats = policy_loss(new, new.detach(), adv, mask, aggregation=aggregation,
                              ref_logprobs=ref, kl_coef=0.1)
    assert loss.item() == pytest.approx(0.1 * kl_mean, abs=1e-15)
    assert stats["kl_ref"] == pytest.approx(0.5 / 3, abs=1e-15)  # always a token mean
    loss.backward()
    # d k3 / d logp_new = 1 - ref/new: -1, +0.5 | 0; token weights 1/3 or 1/4, 1/4 | 1/2
    w = 1 / 3 if aggregation == "token_mean" else 1 / 4
    assert new.grad[0].tolist() == pytest.approx([-0.1 * w, 0.05 * w], abs=1e-15)
    assert new.grad[1, 0].item() == 0.0
    assert ref.grad is None


def test_kl_is_zero_when_ref_equals_new_and_absent_from_stats_when_unused():
    new, old, adv, mask = _case(*GOLDEN)
    plain, stats = policy_loss(new, old, adv, mask)
    assert "kl_ref" not in stats and "entropy" not in stats
    with_kl, stats = policy_loss(new, old, adv, mask, ref_logprobs=new.clone(), kl_coef=1.0)
    assert with_kl.item() == plain.item() and stats["kl_ref"] == 0.0


# --------------------------------------------------------------------------- entropy

def test_token_entropy_golden():
    # [0, 0] -> ln 2; [0, ln 3] -> p = (1/4, 3/4): -(1/4 ln 1/4 + 3/4 ln 3/4); 4 equal -> ln 4
    logits = torch.tensor([[[0.0, 0.0, -math.inf, -math.inf],
                            [0.0, math.log(3), -math.inf, -math.inf],
                            [1.0, 1.0, 1.0, 1.0]]], dtype=torch.float64, requires_grad=True)
    h = token_entropy(logits)
    assert h.shape == (1, 3)
    expected = [math.log(2), -(0.25 * math.log(0.25) + 0.75 * math.log(0.75)), math.log(4)]
    assert h[0].tolist() == pytest.approx(expected, abs=1e-12)
    h.sum().backward()  # masked logits give finite (zero) gradients, not nan
    assert torch.all(torch.isfinite(logits.grad))
    # at the maximum (uniform) the gradient is 0; p = (1/4, 3/4): dH/dl_1 = -p_1 p_0 ln(p_1/p_0)
    assert logits.grad[0, 2].abs().max().item() < 1e-12
    assert logits.grad[0, 1, 1].item() == pytest.approx(-0.75 * 0.25 * math.log(3), abs=1e-12)


def test_entropy_bonus_is_subtracted():
    # A = 0; H = [1, 2 | 0.5, pad]; token_mean of H = 3.5 / 3; loss = -0.01 * 3.5 / 3
    new, old, adv, mask = _case([[1.0, 1.0], [1.0]], [0.0, 0.0])
    h = torch.tensor([[1.0, 2.0], [0.5, 9.0]], dtype=torch.float64, requires_grad=True)
    loss, stats = policy_loss(new, old, adv, mask, aggregation="token_mean",
                              entropy=h, entropy_coef=0.01)
    assert loss.item() == pytest.approx(-0.01 * 3.5 / 3, abs=1e-15)
    assert stats["entropy"] == pytest.approx(3.5 / 3)
    loss.backward()  # more entropy, lower loss
    assert h.grad.flatten().tolist() == pytest.approx([-0.01 / 3, -0.01 / 3, -0.01 / 3, 0.0])


# ----------------------------------------------------------------------- IS weights

def test_truncated_is_weights_golden():
    # log(prox/behav) = ln 3, ln 0.5, 0 | ln 1.5, pad; cap 2 -> 2, 0.5, 1 | 1.5, 0
    behav = torch.zeros(2, 3, dtype=torch.float64)
    prox = torch.tensor([[math.log(3), math.log(0.5), 0.0], [math.log(1.5), 100.0, 0.0]],
                        dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[True, True, True], [True, False, False]])
    w, stats = truncated_is_weights(prox, behav, mask, 2.0)
    assert w.flatten().tolist() == pytest.approx([2.0, 0.5, 1.0, 1.5, 0.0, 0.0], abs=1e-12)
    assert not w.requires_grad
    assert stats["is_weight_mean"] == pytest.approx((2 + 0.5 + 1 + 1.5) / 4)
    assert stats["is_truncated_frac"] == pytest.approx(1 / 4)
    assert stats["is_log_ratio_max"] == pytest.approx(math.log(3))  # padding's 100 ignored
    with pytest.raises(ValueError, match="cap"):
        truncated_is_weights(prox, behav, mask, 0.0)
    with pytest.raises(ValueError, match="behaviour_logprobs"):
        truncated_is_weights(prox, behav[:, :2], mask, 2.0)


def test_is_weights_scale_the_pg_term_and_are_detached():
    # ratio 1, A = +1: per-token pg -1 times w = (2, 0.5); token_mean (-2 - 0.5) / 2
    new, old, adv, mask = _case([[1.0, 1.0]], [1.0])
    new.requires_grad_(True)
    w = torch.tensor([[2.0, 0.5]], dtype=torch.float64, requires_grad=True)
    loss, _ = policy_loss(new, old, adv, mask, aggregation="token_mean", is_weights=w)
    assert loss.item() == pytest.approx(-1.25)
    loss.backward()
    assert new.grad.flatten().tolist() == pytest.approx([-1.0, -0.25])
    assert w.grad is None


def test_option_errors_name_the_argument():
    new, old, adv, mask = _case(*GOLDEN)
    for name in ("is_weights", "ref_logprobs", "entropy"):
        with pytest.raises(ValueError, match=name):
            policy_loss(new, old, adv, mask, **{name: new[:, :1]})
    with pytest.raises(ValueError, match="kl_coef=0.1 needs ref_logprobs"):
        policy_loss(new, old, adv, mask, kl_coef=0.1)
    with pytest.raises(ValueError, match="entropy_coef=0.1 needs entropy"):
        policy_loss(new, old, adv, mask, entropy_coef=0.1)
    with pytest.raises(ValueError, match="ratio_level"):
        policy_loss(new, old, adv, mask, ratio_level="group")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_tokens"):
        policy_loss(new, old, adv, mask, aggregation="seq_mean_token_sum_norm", max_tokens=0)


# ------------------------------------------------------------ a tiny real model, float64

def test_parameter_gradient_on_a_tiny_llama_matches_finite_differences():
    """Autograd through stages.train.grpo.sequence_logprobs (shared-prefix forward) and
    the loss with KL and clip-higher matches central differences on one weight."""
    policy = TinyLlama(hidden_size=32, num_layers=1, num_heads=2).build(seed=0)
    model = policy.model.double().eval()
    tok = policy.tokenizer
    prompts = [tok.encode(p) for p in ["State the answer: 1 + 2 =", "State the answer: 9 - 4 ="]]
    completions = [tok.encode("3") + [tok.eos_token_id], tok.encode("15") + [tok.eos_token_id]]
    with torch.no_grad():
        current, mask = sequence_logprobs(model, prompts, completions)
    current = current.double()
    assert mask.tolist() == [[True, True, False], [True, True, True]]
    # behaviour and reference logprobs offset from the current ones, away from the clip
    # edges (ratio 0.8, 1.28) so that no kink lies within the finite-difference step:
    # ratios e^-0.05 inside, e^0.5 clipped (A>0) | e^-0.4 clipped (A<0), e^-0.02 inside,
    # e^0.3 pessimistic side (A<0, unclipped)
    old = current + torch.tensor([[0.05, -0.5, 0.0], [0.4, 0.02, -0.3]], dtype=torch.float64)
    ref = current + torch.tensor([[0.3, -0.2, 0.0], [0.1, 0.25, -0.1]], dtype=torch.float64)
    adv = torch.tensor([1.0, -0.6], dtype=torch.float64)
    weight = model.model.layers[0].mlp.down_proj.weight

    def loss() -> torch.Tensor:
        new, _ = sequence_logprobs(model, prompts, completions)
        return policy_loss(new.double(), old, adv, mask, clip_low=0.2, clip_high=0.28,
                           aggregation="seq_mean_token_sum_norm", max_tokens=4,
                           ref_logprobs=ref, kl_coef=0.5)[0]

    model.zero_grad()
    loss().backward()
    grad = weight.grad.detach().clone()
    at = tuple(int(i) for i in torch.nonzero(grad.abs() == grad.abs().max())[0])
    h = 1e-2
    with torch.no_grad():
        base = weight[at].item()
        weight[at] = base + h
        up = loss().item()
        weight[at] = base - h
        down = loss().item()
        weight[at] = base
    numeric = (up - down) / (2 * h)
    # the logprobs pass through float32 in the engine convention (log_softmax on
    # .float() logits): round-off ~1e-7 over 2h = 2e-2 is ~5e-6, hence the large step;
    # the O(h^2) truncation error stays far below the tolerance
    assert abs(grad[at].item()) > 1e-3
    assert numeric == pytest.approx(grad[at].item(), rel=2e-3)
