"""The learner at a real vocabulary's memory: chunked completion logprobs (same values
and gradients as the full-logits pass, never more than a chunk of logits at once),
gradient checkpointing, and the per-step peak memory metric."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
import torch

from gfcr.core.rollout import col
from stages import GRPO, TinyLlama
from stages.engines.hf_sampling import batch_token_logprobs
from stages.logprobs import completion_logits, completion_scores, gather_logprobs
from stages.train.loss import token_entropy

TINY = TinyLlama(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)
PROMPTS = [[5, 6, 7, 8, 9, 10, 11, 12, 13, 14], [5, 6, 7, 8, 9, 10, 11, 12, 13, 15, 16], [20, 21]]
COMPLETIONS = [[30, 31, 32], [40], [50, 51, 52, 53, 54]]


def _grads(model: torch.nn.Module) -> list[torch.Tensor]:
    out = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return out


@pytest.mark.parametrize("temperature", [1.0, 0.7, 0.0])
def test_chunked_logprobs_equal_the_full_logits_pass(temperature: float) -> None:
    model = TINY.build(seed=0).model
    lp, mask, ent = completion_scores(model, PROMPTS, COMPLETIONS, temperature,
                                      entropy=token_entropy, chunk_tokens=2)
    (lp.sum() + ent.sum()).backward()
    chunked = _grads(model)
    logits, targets, full_mask = completion_logits(model, PROMPTS, COMPLETIONS, temperature)
    want = gather_logprobs(logits, targets, full_mask)
    want_ent = token_entropy(logits).masked_fill(~full_mask, 0.0)
    (want.sum() + want_ent.sum()).backward()
    assert torch.equal(mask, full_mask)
    assert torch.allclose(lp, want, atol=1e-5) and torch.allclose(ent, want_ent, atol=1e-5)
    for a, b in zip(chunked, _grads(model)):
        assert torch.allclose(a, b, atol=1e-5)


def test_no_more_than_a_chunk_of_logits_exists_at_once() -> None:
    model = TINY.build(seed=0).model
    rows: list[int] = []
    model.lm_head.register_forward_hook(lambda m, i, o: rows.append(o.shape[0]))
    lp, _, _ = completion_scores(model, PROMPTS, COMPLETIONS, 1.0, chunk_tokens=4)
    lp.sum().backward()  # the backward rebuilds each chunk's logits: the hook sees it again
    # 9 completion tokens (no padding row, no prompt row); the backward goes last first
    assert rows[:3] == [4, 4, 1] and sorted(rows[3:]) == [1, 4, 4]


def _batch(policy: Any) -> pa.Table:
    """A group of four rows whose behaviour logprobs are the current policy's."""
    tok = policy.tokenizer
    prompt = tok.encode("1+2=")
    completions = [tok.encode(c) for c in ("3", "12", "4", "3x")]
    with torch.no_grad():
        lp, _ = batch_token_logprobs(policy.model, [prompt] * 4, completions)
    return pa.table({col.PROMPT_IDS: [prompt] * 4, col.COMPLETION_IDS: completions,
                     col.LOGPROBS: [lp[i, :len(c)].tolist() for i, c in enumerate(completions)],
                     col.REWARD: [1.0, 0.0, 0.0, 1.0], col.GROUP_ID: ["g"] * 4})


def test_gradient_checkpointing_gives_the_same_gradient() -> None:
    grads = []
    for checkpointing in (False, True):
        policy = TINY.build(seed=0)
        learner = GRPO(lr=1e-3, gradient_checkpointing=checkpointing).learner(policy, seed=0)
        learner.loss_and_gradients(None, _batch(policy))
        grads.append(_grads(policy.model))
    for a, b in zip(*grads):
        assert torch.allclose(a, b, atol=1e-6)


def test_every_update_reports_its_peak_memory() -> None:
    policy = TINY.build(seed=0)
    metrics = GRPO(lr=1e-3).learner(policy, seed=0).update(None, _batch(policy)).metrics
    assert metrics["peak_memory_scope"] == 1.0  # per step: Linux's VmHWM, reset first
    assert 10.0 < metrics["peak_memory_mb"] < 1e6
