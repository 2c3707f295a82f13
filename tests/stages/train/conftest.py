"""Shared builders for the learner tests: a tiny real Llama policy and rollout batches
whose behaviour logprobs come from it (optionally shifted, to fake a stale policy)."""

from __future__ import annotations

from typing import Sequence

import pyarrow as pa
import pytest
import torch

from stages.engines.hf_sampling import batch_token_logprobs
from stages.engines.tiny import TinyLlama

TINY = TinyLlama(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, tokenizer="char")
"""The char vocabulary: these tests' tolerances and ties were set with its 101 ids."""
PROMPTS = ["State the answer: 1 + 2 =", "State the answer: 13 - 4 =",
           "State the answer: 1 + 2 =", "State the answer: 7 + 7 ="]
COMPLETIONS = ["3", "9", "12", "14"]


def rollouts(policy, rewards: Sequence[float], groups: Sequence[str], *,
             completions: Sequence[str] = COMPLETIONS,
             shift: Sequence[Sequence[float]] | None = None,
             **extra: Sequence) -> pa.Table:
    """Rollout rows (prompt i % 4, completion i % len(completions) + EOS) whose behaviour
    logprobs are the policy's own minus ``shift[i]`` (per token); ``extra`` adds columns
    (``hint_tokens`` int32, ``policy_version_start`` int64, others as given)."""
    tok = policy.tokenizer
    n = len(rewards)
    prompts = [tok.encode(PROMPTS[i % 4]) for i in range(n)]
    comps = [tok.encode(completions[i % len(completions)]) + [tok.eos_token_id]
             for i in range(n)]
    with torch.no_grad():
        lp, _ = batch_token_logprobs(policy.model, prompts, comps)
    logprobs = [lp[i, :len(c)].tolist() for i, c in enumerate(comps)]
    if shift is not None:
        logprobs = [[v - d for v, d in zip(row, s)] for row, s in zip(logprobs, shift)]
    columns = {"reward": pa.array(rewards, pa.float64()), "group_id": list(groups),
               "prompt_ids": prompts, "completion_ids": comps,
               "logprobs": pa.array(logprobs, pa.list_(pa.float32()))}
    types = {"hint_tokens": pa.int32(), "policy_version_start": pa.int64(),
             "policy_version_end": pa.int64(), "replay_count": pa.int32(),
             "token_keep_ratio": pa.float64(), "d3s_advantage": pa.float64()}
    for name, values in extra.items():
        columns[name] = pa.array(list(values), types.get(name))
    return pa.table(columns)


@pytest.fixture
def policy():
    return TINY.build(seed=0)


def grads(model) -> list[torch.Tensor]:
    return [p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)
            for p in model.parameters()]


def params(model) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]
