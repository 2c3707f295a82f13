"""The one teacher-forced forward pass: the logits, and logprobs, of given completions
under a model, shared by the engine (stages.engines.hf: behaviour logprobs of forced
tokens), the trainer (stages.train.forward) and the tree's branch points
(stages.generate._policy). Kept outside every kind's folder, like stages.advantages, so
they import it and not each other.

The convention (gfcr.engine): a token's logprob is ``log_softmax(logits / T)`` at its
position, of the raw logits for ``T == 0``, in float32; padding positions hold 0 with
``mask`` false. The prompts' longest common token prefix is run once and its KV cache
repeated over the batch (the shared-prefix forward of "Prefix Grouper", 2025) when that
pays; otherwise one right-padded pass.
"""

from __future__ import annotations

from typing import Any

import torch


def log_probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """The convention on a logits tensor ``[..., V]``: float32
    ``log_softmax(logits / T)``, of the raw logits when ``T == 0``."""
    logits = logits.float()
    return torch.log_softmax(logits / temperature if temperature > 0 else logits, dim=-1)


def completion_logprobs(model: Any, prompts: list[list[int]], completions: list[list[int]],
                        temperature: float = 1.0, pad_id: int = 0
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(logprobs, mask)``, both ``[B, longest completion]``: each completion token's
    logprob under the convention, 0 on padding. Differentiable when grad is enabled."""
    logits, targets, mask = completion_logits(model, prompts, completions, temperature, pad_id)
    return gather_logprobs(logits, targets, mask), mask


_MIN_SHARED = 8
"""Shortest common prompt prefix worth a separate forward pass."""


def completion_logits(model: Any, prompts: list[list[int]], completions: list[list[int]],
                      temperature: float = 1.0, pad_id: int = 0
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(logits / T, targets, mask)``: float32 logits ``[B, T, V]`` predicting each
    completion token (divided by ``T`` unless ``T == 0``), the token ids ``[B, T]`` and
    the mask of real tokens ``[B, T]``. Shared-prefix forward where it pays (see
    :func:`sequence_logprobs`), one right-padded pass otherwise."""
    if len(prompts) != len(completions):
        raise ValueError(f"completion_logits: {len(prompts)!r} prompts but "
                         f"{len(completions)!r} completions")
    if any(not p for p in prompts):
        raise ValueError("completion_logits: every prompt needs at least one token")
    device = next(model.parameters()).device
    k, cache = _shared_prefix(model, prompts, device)
    ids, attn, width = _suffix_batch(prompts, completions, k, pad_id)
    if cache is None:
        out = model(input_ids=ids.to(device), attention_mask=attn.to(device))
    else:
        positions = torch.arange(k, k + width, device=device).expand(len(prompts), -1)
        out = model(input_ids=ids.to(device), attention_mask=attn.to(device),
                    position_ids=positions, past_key_values=cache, use_cache=True)
    logits = out.logits
    n_out = max((len(c) for c in completions), default=0)
    # completion token j of row i is predicted at suffix position len(prompt_i) - k - 1 + j
    starts = torch.tensor([len(p) - k - 1 for p in prompts], device=device)
    where = (starts[:, None] + torch.arange(n_out, device=device)[None, :]).clamp(max=width - 1)
    picked = logits.gather(1, where[:, :, None].expand(-1, -1, logits.shape[-1])).float()
    targets = torch.zeros((len(prompts), n_out), dtype=torch.long)
    mask = torch.zeros((len(prompts), n_out), dtype=torch.bool)
    for i, c in enumerate(completions):
        targets[i, :len(c)] = torch.tensor(list(c), dtype=torch.long)
        mask[i, :len(c)] = True
    scaled = picked / temperature if temperature > 0 else picked
    return scaled, targets.to(device), mask.to(device)


def gather_logprobs(logits: torch.Tensor, targets: torch.Tensor,
                    mask: torch.Tensor) -> torch.Tensor:
    """log_softmax of already-scaled ``logits`` at ``targets``; 0 where ``mask`` is false."""
    logprobs = torch.log_softmax(logits, dim=-1).gather(-1, targets[:, :, None]).squeeze(-1)
    return logprobs.masked_fill(~mask, 0.0)


def _shared_prefix(model: Any, prompts: list[list[int]], device: torch.device
                   ) -> tuple[int, Any]:
    """``(k, cache)``: the common prefix length and its KV cache repeated over the batch,
    or ``(0, None)`` when sharing does not pay or the cache cannot be repeated."""
    k = _common_prefix(prompts)
    if k < _MIN_SHARED or len(prompts) < 2:
        return 0, None
    shared = model(input_ids=torch.tensor([prompts[0][:k]], device=device), use_cache=True)
    cache = shared.past_key_values
    if not hasattr(cache, "batch_repeat_interleave"):  # transformers' cache API differs by version
        return 0, None
    cache.batch_repeat_interleave(len(prompts))
    return k, cache


def _common_prefix(prompts: list[list[int]]) -> int:
    """Length of the longest common prefix, leaving every prompt at least one token."""
    first = prompts[0]
    k = min(len(p) for p in prompts) - 1
    for p in prompts[1:]:
        j = 0
        while j < k and p[j] == first[j]:
            j += 1
        k = j
    return max(k, 0)


def _suffix_batch(prompts: list[list[int]], completions: list[list[int]], k: int,
                  pad_id: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Right-padded (prompt[k:] + completion) ids, and the mask over prefix + suffix."""
    rows = [list(p[k:]) + list(c) for p, c in zip(prompts, completions)]
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(rows), k + width), dtype=torch.long)
    attn[:, :k] = 1
    for i, r in enumerate(rows):
        ids[i, :len(r)] = torch.tensor(r, dtype=torch.long)
        attn[i, k:k + len(r)] = 1
    return ids, attn, width
