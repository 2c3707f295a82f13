"""Trainer mechanics: token-budget micro-batches, LR schedule, bf16, KL reference,
entropy bonus, GSPO ratio, GDPO components, config rules."""

import copy
import math
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pytest
import torch
from pydantic import ValidationError

from stages.train.advantages import lookup_advantage, reward_components
from stages.train.batching import pack
from stages.train.forward import sequence_logprobs, sequence_logprobs_entropy
from stages.train.grpo import GRPO
from stages.train.loss import token_entropy
from stages.train.optim import lr_factor
from tests.stages.train.conftest import TINY, grads, params, rollouts

REWARDS = [1.0, 0.0, 0.2, 0.7, 0.9, 0.1, 0.0, 0.4]
GROUPS = ["a", "a", "b", "b", "c", "c", "d", "d"]
LONG = ["123", "9", "12", "14", "7777", "5", "808", "11"]


def test_pack_respects_rows_and_the_padded_token_budget():
    assert pack([3, 3, 5, 2], max_rows=8, max_tokens=9) == [[0, 1], [2], [3]]
    assert pack([3, 3, 5, 2], max_rows=2) == [[0, 1], [2, 3]]
    assert pack([20, 1], max_rows=4, max_tokens=10) == [[0], [1]]  # too long: alone
    lengths = [7, 3, 9, 9, 2, 4, 6]
    for run in pack(lengths, max_rows=3, max_tokens=18):
        assert len(run) <= 3 and (len(run) == 1 or len(run) * max(lengths[i] for i in run) <= 18)


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean", "seq_mean_token_sum_norm"])
def test_token_budget_micro_batches_accumulate_to_the_full_batch_gradient(aggregation):
    out = []
    for budget in (None, 40):
        policy = TINY.build(seed=0)
        batch = rollouts(policy, REWARDS, GROUPS, completions=LONG)
        learner = GRPO(aggregation=aggregation, micro_batch_tokens=budget).learner(policy, seed=0)
        work = learner.prepare(None, batch, lookup_advantage("grpo")(np.array(REWARDS),
                                                                      np.array(GROUPS)))
        n_parts = len(learner._micro_batches(work))
        out.append((learner.loss_and_gradients(None, batch), grads(policy.model), n_parts))
    (full_loss, full, one), (acc_loss, acc, many) = out
    assert one == 1 and many >= 3
    assert acc_loss == pytest.approx(full_loss, rel=1e-5, abs=1e-6)  # ~0 on policy
    for a, b in zip(full, acc):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-7)


def test_lr_schedules_and_the_learner_follows_the_step():
    assert [lr_factor(s, "constant", warmup=3) for s in range(4)] == [1 / 3, 2 / 3, 1.0, 1.0]
    assert [lr_factor(s, "linear", total=4) for s in range(5)] == [1.0, 0.75, 0.5, 0.25, 0.0]
    assert lr_factor(2, "cosine", total=4) == pytest.approx(0.5)
    policy = TINY.build(seed=0)
    spec = GRPO(lr=1e-2, lr_schedule="cosine", warmup_steps=1, total_steps=5)
    learner = spec.learner(policy, seed=0)
    batch = rollouts(policy, REWARDS, GROUPS, completions=LONG)
    for step in (0, 3):
        m = learner.update(SimpleNamespace(step=step, policy_version=0), batch).metrics
        want = 1e-2 * (1.0 if step == 0 else 0.5 * (1 + math.cos(math.pi * 2 / 4)))
        assert m["lr"] == pytest.approx(want)
        assert learner.optimizer.param_groups[0]["lr"] == pytest.approx(want)


def test_bf16_autocast_runs_on_cpu_with_a_close_loss():
    losses = {}
    for precision in ("fp32", "bf16"):
        policy = TINY.build(seed=0)
        batch = rollouts(policy, REWARDS, GROUPS, completions=LONG)
        learner = GRPO(precision=precision).learner(policy, seed=0)
        losses[precision] = learner.loss_and_gradients(None, batch)
        assert all(torch.isfinite(g).all() for g in grads(policy.model))
        assert learner.update(None, batch).metrics["grad_norm"] > 0
    assert losses["bf16"] == pytest.approx(losses["fp32"], rel=0.05, abs=1e-3)


def test_kl_reference_is_the_policy_at_the_first_update_and_round_trips():
    policy = TINY.build(seed=0)
    with torch.no_grad():  # stands in for a warm start after the learner was built
        for p in policy.model.parameters():
            p.add_(0.01)
    spec = GRPO(lr=1e-2, kl_coef=0.5)
    learner = spec.learner(policy, seed=0)
    batch = rollouts(policy, REWARDS, GROUPS, completions=LONG)
    assert learner.reference is None
    first = learner.update(None, batch).metrics
    assert first["kl_ref"] == pytest.approx(0.0, abs=1e-7)  # reference == policy at update 1
    learner.update(None, batch)
    saved = copy.deepcopy(learner.state_dict())
    third = learner.update(None, batch)
    assert third.metrics["kl_ref"] > 0
    expected = params(policy.model)

    other = TINY.build(seed=1)
    again = spec.learner(other, seed=0)
    again.load_state_dict(saved)
    replay = again.update(None, batch)
    assert replay.metrics["loss"] == pytest.approx(third.metrics["loss"], rel=1e-6)
    for a, b in zip(expected, other.model.parameters()):
        assert torch.allclose(a, b, atol=1e-7)
    assert GRPO().learner(TINY.build(seed=0), seed=0).state_dict()["reference"] is None


def test_entropy_bonus_and_its_entropy_variant_of_the_forward():
    policy = TINY.build(seed=0)
    tok = policy.tokenizer
    prompts = [tok.encode("State the answer: 1 + 2 ="), tok.encode("State the answer: 3 =")]
    completions = [tok.encode("12") + [tok.eos_token_id], tok.encode("4") + [tok.eos_token_id]]
    lp, mask = sequence_logprobs(policy.model, prompts, completions, 0.7)
    lp2, mask2, h = sequence_logprobs_entropy(policy.model, prompts, completions, 0.7,
                                              entropy=token_entropy)
    assert torch.equal(lp, lp2) and torch.equal(mask, mask2)
    assert h[1, 2] == 0 and (h[mask] > 0).all() and h.requires_grad
    batch = rollouts(policy, REWARDS, GROUPS, completions=LONG)
    with_bonus = GRPO(entropy_coef=0.01).learner(policy, seed=0).update(None, batch).metrics
    assert with_bonus["entropy"] > 0


def test_gspo_sequence_ratio_trains():
    policy = TINY.build(seed=0)
    before = params(policy.model)
    spec = GRPO(ratio_level="sequence", clip_low=3e-4, clip_high=4e-4, lr=1e-2)
    m = spec.learner(policy, seed=0).update(None, rollouts(policy, REWARDS, GROUPS,
                                                           completions=LONG)).metrics
    assert m["ratio_mean"] == pytest.approx(1.0, abs=1e-5) and m["grad_norm"] > 0
    assert any(not torch.equal(a, b) for a, b in zip(before, policy.model.parameters()))


def test_gdpo_reads_the_reward_components():
    policy = TINY.build(seed=0)
    comps = [{"format": float(i % 2), "correct": r} for i, r in enumerate(REWARDS)]
    batch = rollouts(policy, REWARDS, GROUPS, completions=LONG)
    batch = batch.append_column("rewards", pa.array(
        [list(c.items()) for c in comps], pa.map_(pa.string(), pa.float64())))
    result = GRPO(advantage="gdpo").learner(policy, seed=0).update(None, batch)
    components = reward_components(batch.column("rewards").to_pylist())[1]
    want = lookup_advantage("gdpo")(np.array(REWARDS), np.array(GROUPS), components)
    assert result.advantages == pytest.approx(want.tolist())
    assert not np.allclose(want, lookup_advantage("gdpo")(np.array(REWARDS), np.array(GROUPS)))
    bad = batch.set_column(batch.column_names.index("rewards"), "rewards", pa.array(
        [[("a", 1.0)]] + [list(c.items()) for c in comps[1:]],
        pa.map_(pa.string(), pa.float64())))
    with pytest.raises(ValueError, match="stage 'grpo': advantage='gdpo' needs the same"):
        GRPO(advantage="gdpo").learner(policy, seed=0).update(None, bad)


def test_new_config_fields_are_validated():
    with pytest.raises(ValidationError, match=r"lr_schedule='cosine' needs total_steps"):
        GRPO(lr_schedule="cosine")
    with pytest.raises(ValidationError, match=r"warmup_steps=5 must be below total_steps=5"):
        GRPO(lr_schedule="linear", warmup_steps=5, total_steps=5)
    for bad in ({"precision": "fp16"}, {"ratio_level": "group"}, {"tis_cap": 0.0},
                {"kl_coef": -1.0}, {"micro_batch_tokens": 0},
                {"aggregation": "seq_sum"}, {"norm_tokens": 0}):
        with pytest.raises(ValidationError, match=next(iter(bad))):
            GRPO(**bad)
    GRPO(aggregation="seq_mean_token_sum_norm", norm_tokens=16, precision="bf16",
         lr_schedule="linear", total_steps=10, warmup_steps=2, tis_cap=None)
