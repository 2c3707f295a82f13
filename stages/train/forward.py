"""Teacher-forced forward passes of the trainer: completion logprobs, and their entropy.

One function computes the logprobs at every completion position
(:func:`stages.logprobs.completion_scores`, shared with the engine and the tree's branch
points; the full-vocabulary logits exist for a chunk of tokens at a time); :func:`sequence_logprobs` and :func:`sequence_logprobs_entropy` are thin views of
it, so the forward pass exists once.

The convention is the engine's (:mod:`stages.logprobs`): a token's
logprob is ``log_softmax(logits / T)`` at its position, raw logits for ``T == 0``, and
padding positions hold 0 with ``mask`` false.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from stages.logprobs import completion_scores


def sequence_logprobs(model: Any, prompts: list[list[int]], completions: list[list[int]],
                      temperature: float = 1.0, pad_id: int = 0
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """Teacher-forced ``log_softmax(logits / T)`` (raw logits for ``T == 0``) of each
    completion token: the engine's convention (:func:`stages.engines.hf_sampling.batch_token_logprobs`,
    same shapes and values). Returns ``(logprobs, mask)``, both ``[B, T]``.

    The rows run packed where that costs less (:mod:`stages.packing`: one row holding
    every token once, a GRPO group's prompt shared by its completions, no padding),
    else padded: the prompts' longest common token prefix run once and its KV cache
    repeated over the batch (the shared-prefix forward of "Prefix Grouper", 2025), then
    one right-padded pass. Gradients flow through the shared part either way.
    """
    logprobs, mask, _ = completion_scores(model, prompts, completions, temperature, pad_id)
    return logprobs, mask


def sequence_logprobs_entropy(model: Any, prompts: list[list[int]],
                              completions: list[list[int]], temperature: float = 1.0,
                              pad_id: int = 0, *,
                              entropy: Callable[[torch.Tensor], torch.Tensor]
                              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`sequence_logprobs` plus ``entropy(logits / T)`` at each completion position
    (``[B, T]``, 0 on padding): the entropy of the next-token distribution the token was
    drawn from, at the sampling temperature. ``entropy`` maps ``[..., V]`` logits to
    ``[...]`` (``stages.train.loss.token_entropy``); gradients flow through it."""
    logprobs, mask, ent = completion_scores(model, prompts, completions, temperature, pad_id,
                                            entropy=entropy)
    assert ent is not None  # asked for
    return logprobs, mask, ent
