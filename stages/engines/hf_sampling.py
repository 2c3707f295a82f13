"""The HF engine's arithmetic on logprob rows: the next token drawn from a row (greedy, or
sampled within the top-p nucleus), a row's ``k`` most likely entries, and the
teacher-forced logprobs of whole completions (the one forward pass the trainer and the
tree share, :func:`stages.logprobs.completion_logprobs`), all under the logprob convention
of :mod:`stages.engines.hf` (``log_softmax(logits / T)``, taken before top-p).
"""

from __future__ import annotations

from typing import Any

import torch

from gfcr.core.engine import SamplingParams
from stages.logprobs import completion_logprobs


def token_logprobs(model: Any, prompt_ids: list[int], completion_ids: list[int],
                   temperature: float = 1.0) -> torch.Tensor:
    """Teacher-forced logprobs of ``completion_ids`` after ``prompt_ids``, one per token,
    under the engine's convention. Differentiable when grad is enabled."""
    logprobs, _ = batch_token_logprobs(model, [prompt_ids], [completion_ids], temperature)
    return logprobs[0, :len(completion_ids)]


def batch_token_logprobs(model: Any, prompts: list[list[int]], completions: list[list[int]],
                         temperature: float = 1.0, pad_id: int = 0
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """Teacher-forced logprobs of many completions: the one forward pass the trainer and
    the tree share (:func:`stages.logprobs.completion_logprobs`).

    Returns ``(logprobs, mask)``, both ``[batch, longest completion]``: row i holds the
    logprobs of completion i's tokens, zero where ``mask`` is False (padding).
    """
    return completion_logprobs(model, prompts, completions, temperature, pad_id)


def sample_next(logp: torch.Tensor, params: SamplingParams, gen: torch.Generator
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """Next token per row and its logprob, from the rows' logprobs (convention above,
    before top-p)."""
    if params.temperature == 0:
        tok = logp.argmax(dim=-1)
    else:
        probs = logp.exp()
        if params.top_p < 1.0:
            probs = nucleus(probs, params.top_p)
        tok = torch.multinomial(probs, 1, generator=gen).squeeze(1)
    return tok, logp.gather(1, tok[:, None]).squeeze(1)


def top_entries(logp: torch.Tensor, k: int) -> list[list[tuple[int, float]]] | None:
    """Each row's ``k`` most likely (token, logprob) pairs; None when ``k`` is 0."""
    if k == 0:
        return None
    values, ids = logp.topk(min(k, logp.shape[-1]), dim=-1)
    return [list(zip(map(int, i), map(float, v)))
            for i, v in zip(ids.tolist(), values.double().tolist())]


def nucleus(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Zero every token outside the smallest top set whose mass reaches ``top_p``
    (the most likely token always stays)."""
    sorted_p, order = probs.sort(dim=-1, descending=True)
    drop = (sorted_p.cumsum(dim=-1) - sorted_p) >= top_p
    return probs.scatter(-1, order, sorted_p.masked_fill(drop, 0.0))
