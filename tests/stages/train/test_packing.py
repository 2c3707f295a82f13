"""Packed micro-batches (stages.packing): the same logprobs and gradients as each row run
alone, on the tiny Llama and a SmolLM2-shaped Llama (grouped-query attention, tied
embeddings, its rope base), through every attention the packed row can take."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from stages import packing
from stages.engines.tiny import TinyLlama
from stages.logprobs import completion_scores, route
from stages.train.batching import plan, slots, waste
from stages.train.grpo import GRPO
from stages.train.advantages import lookup_advantage
from tests.stages.train.conftest import TINY, grads, rollouts

REWARDS = [1.0, 0.0, 0.2, 0.7, 0.9, 0.1, 0.0, 0.4]
GROUPS = ["a", "a", "b", "b", "c", "c", "d", "d"]
LONG = ["123", "9", "12", "14", "7777", "5", "808", "11"]


def _tiny_llama() -> torch.nn.Module:
    return TinyLlama(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64,
                     tokenizer="char").build(seed=0).model


def _smollm2_shaped() -> torch.nn.Module:
    """SmolLM2-135M's architecture (LlamaForCausalLM, 3 query heads per key-value head,
    tied embeddings, rope base 100000) at a test's size."""
    config = LlamaConfig(vocab_size=101, hidden_size=48, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=2,
                         rope_theta=100000.0, tie_word_embeddings=True,
                         max_position_embeddings=256, attn_implementation="sdpa")
    torch.manual_seed(0)
    return LlamaForCausalLM(config).float()


ARCHITECTURES = {"tiny_llama": _tiny_llama, "smollm2_shaped": _smollm2_shaped}


def _batch(seed: int = 0) -> tuple[list[list[int]], list[list[int]]]:
    """Three groups of three rows sharing a prompt; two completions share a start (the
    tree shares them too); prompts of 2 to 12 tokens, completions of 1 to 9."""
    rng = random.Random(seed)
    prompts, completions = [], []
    for _ in range(3):
        prompt = [rng.randrange(3, 100) for _ in range(rng.randrange(2, 13))]
        for _ in range(3):
            prompts.append(prompt)
            completions.append([rng.randrange(3, 100) for _ in range(rng.randrange(1, 10))])
    completions[1] = completions[0][:2] + [7]
    return prompts, completions


def _alone(model, prompts, completions, weights):
    """Each row in a forward of its own (no padding, no packing): logprobs and the
    gradient of ``sum(weights x logprobs)``."""
    model.zero_grad(set_to_none=True)
    rows = []
    for p, c in zip(prompts, completions):
        lp, _, _ = completion_scores(model, [p], [c], pack=False)
        rows.append(lp[0])
    total = sum((w[:len(r)] * r).sum() for w, r in zip(weights, rows))
    total.backward()
    return rows, [q.grad.clone() for q in model.parameters()]


@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_packed_logprobs_and_gradients_equal_each_row_alone(arch):
    model = ARCHITECTURES[arch]()
    prompts, completions = _batch()
    weights = torch.linspace(-1.0, 1.0, 9)[:, None] * torch.ones(9, 9)
    expected, expected_grads = _alone(model, prompts, completions, weights)
    # the tree under SDPA's boolean mask and eager's additive one; and the sequences end
    # to end, positions only (what a kernel without custom masks gets)
    for attention, how in (("sdpa", "tree"), ("eager", "tree"), ("sdpa", "flat")):
        model.config._attn_implementation = attention
        model.zero_grad(set_to_none=True)
        lp, mask, _ = (completion_scores(model, prompts, completions, pack=True)
                       if how == "tree" else _flat_scores(model, prompts, completions))
        for i, row in enumerate(expected):
            assert mask[i].sum() == len(completions[i])
            torch.testing.assert_close(lp[i, :len(row)], row, atol=1e-5, rtol=1e-5)
            assert (lp[i, len(row):] == 0).all()
        (weights[:, :lp.shape[1]] * lp).sum().backward()
        for got, want in zip((q.grad for q in model.parameters()), expected_grads):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


def _flat_scores(model, prompts, completions):
    """The sequences end to end with positions restarting at 0 and no mask: transformers
    builds the block-diagonal causal mask from the positions (its flash path's input)."""
    out, where = packing.packed_forward(model.model, prompts, completions, "flat")
    hidden = out.last_hidden_state.reshape(-1, out.last_hidden_state.shape[-1])
    logits = model.lm_head(hidden.index_select(0, where.reshape(-1))).float()
    targets = torch.zeros(where.shape, dtype=torch.long)
    mask = torch.zeros(where.shape, dtype=torch.bool)
    for i, c in enumerate(completions):
        targets[i, :len(c)], mask[i, :len(c)] = torch.tensor(c), True
    lp = torch.log_softmax(logits, -1).gather(-1, targets.reshape(-1, 1)).view(where.shape)
    return lp.masked_fill(~mask, 0.0), mask, None


def test_the_tree_runs_a_shared_prompt_once_and_each_token_sees_its_ancestors():
    prompts = [[1, 2, 3]] * 2 + [[4, 5]]
    completions = [[6, 7], [6, 8, 9], [1]]
    row = packing.layout(prompts, completions)
    # 1 2 3 6 7 | 8 9 | 4 5 1: the second row shares "1 2 3 6", the third nothing
    assert row.ids == [1, 2, 3, 6, 7, 8, 9, 4, 5, 1]
    assert row.positions == [0, 1, 2, 3, 4, 4, 5, 0, 1, 2]
    assert row.where == [[2, 3], [2, 3, 5], [8]]
    seen = packing.tree_mask(torch.tensor(row.ends), None)[0, 0]
    ancestors = {0: [0], 1: [0, 1], 2: [0, 1, 2], 3: [0, 1, 2, 3], 4: [0, 1, 2, 3, 4],
                 5: [0, 1, 2, 3, 5], 6: [0, 1, 2, 3, 5, 6], 7: [7], 8: [7, 8], 9: [7, 8, 9]}
    for q, keys in ancestors.items():
        assert seen[q].nonzero().squeeze(1).tolist() == keys
    assert packing.tree_slots(packing.sequences(prompts, completions)) == len(row.ids)


def test_the_plan_packs_a_grpo_batch_with_no_padding_and_reports_it():
    # the benchmark's CPU width: at the tiny widths attention is a larger share of a
    # token's compute, and padded micro-batches (their attention squares smaller) can win
    config = LlamaConfig(vocab_size=101, hidden_size=256, intermediate_size=688,
                         num_hidden_layers=1, num_attention_heads=4,
                         attn_implementation="sdpa")
    model = LlamaForCausalLM(config)
    rng = random.Random(1)
    prompts, completions = [], []
    for _ in range(4):
        prompt = [rng.randrange(3, 100) for _ in range(rng.randrange(16, 40))]
        for _ in range(4):
            prompts.append(prompt)
            completions.append([rng.randrange(3, 100) for _ in range(rng.randrange(2, 60))])
    runs = plan(prompts, completions, max_rows=16, model=model)
    assert sorted(i for run in runs for i in run) == list(range(16))
    assert waste(prompts, completions, runs, model=model) < 0.05
    assert waste(prompts, completions, runs) > 0.05  # the same runs padded would waste
    for run in runs:  # the cost model's path is what the forward takes
        costs = route(model, [prompts[i] for i in run], [completions[i] for i in run])
        if costs is not None and costs.packs:
            assert slots(prompts, completions, run, model=model) == (costs.tokens,) * 2


def test_a_sliding_window_shorter_than_a_sequence_is_not_packed():
    model = _tiny_llama()
    prompts, completions = _batch()
    assert route(model, prompts, completions) is not None
    model.config.sliding_window = 4  # a custom mask would ignore it
    assert route(model, prompts, completions) is None


def test_a_packed_update_is_the_sum_of_its_rows_gradients():
    """The learner stays exact under packing: one packed micro-batch of all rows has the
    loss and gradient that micro-batches of one row each sum to (each micro-batch's loss
    is divided by the whole batch's count)."""
    out = []
    for micro in (8, 1):
        policy = TINY.build(seed=0)
        batch = rollouts(policy, REWARDS, GROUPS, completions=LONG)
        learner = GRPO(micro_batch=micro).learner(policy, seed=0)
        work = learner.prepare(None, batch, lookup_advantage("grpo")(np.array(REWARDS),
                                                                      np.array(GROUPS)))
        runs = learner._micro_batches(work)
        packs = [route(policy.model, [work.prompts[i] for i in run],
                       [work.completions[i] for i in run]) for run in runs]
        out.append((learner.loss_and_gradients(None, batch), grads(policy.model), runs, packs))
    (whole_loss, whole, runs, packs), (rows_loss, rows, singles, _) = out
    assert len(runs) == 1 and packs[0] is not None and packs[0].packs
    assert len(singles) == len(REWARDS)
    assert rows_loss == pytest.approx(whole_loss, rel=1e-5, abs=1e-6)  # ~0 on policy
    for a, b in zip(whole, rows):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)
