"""The clipped policy-gradient loss of PPO/GRPO, as one pure torch function.

PPO (Schulman et al. 2017) clipped surrogate per completion token t of sequence i, with
ratio rho = exp(logp_new - logp_old) against the behaviour policy:

    l_{i,t} = -min(rho * A_i, clip(rho, 1 - clip_low, 1 + clip_high) * A_i)

``clip_high > clip_low`` is DAPO's clip-higher (Yu et al. 2025). Aggregation:

- ``seq_mean``: mean over sequences of the per-sequence token mean (GRPO, Shao et al. 2024);
- ``token_mean``: sum over all tokens / number of tokens (DAPO), so long sequences are not
  down-weighted.

No KL penalty to a reference model (DAPO and Dr. GRPO drop it too).
"""

from __future__ import annotations

from typing import Literal

import torch

Aggregation = Literal["token_mean", "seq_mean"]


def policy_loss(new_logprobs: torch.Tensor, old_logprobs: torch.Tensor,
                advantages: torch.Tensor, mask: torch.Tensor, *,
                clip_low: float = 0.2, clip_high: float = 0.2,
                aggregation: Aggregation = "seq_mean",
                denominator: float | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped surrogate loss and its statistics.

    Shapes: ``new_logprobs``, ``old_logprobs``, ``mask``: [B, T] (mask true on real
    completion tokens); ``advantages``: [B], one per sequence. ``denominator`` overrides the
    count the sum is divided by (tokens for token_mean, non-empty sequences for seq_mean):
    pass the whole batch's count when accumulating gradients over micro-batches, so the
    micro-batch losses add up to the full-batch loss.

    Statistics (floats, over masked tokens): ``clip_frac`` (tokens whose clipped term is
    the active one), ``approx_kl`` (k3 estimator of KL(old || new), Schulman 2020:
    mean of rho - 1 - log rho) and ``ratio_mean``.
    """
    if new_logprobs.shape != old_logprobs.shape or new_logprobs.shape != mask.shape:
        raise ValueError(f"new_logprobs {tuple(new_logprobs.shape)}, old_logprobs "
                         f"{tuple(old_logprobs.shape)} and mask {tuple(mask.shape)} must match")
    if advantages.shape != new_logprobs.shape[:1]:
        raise ValueError(f"advantages {tuple(advantages.shape)} must have one entry per "
                         f"sequence ({new_logprobs.shape[0]})")
    mask = mask.to(new_logprobs.dtype)
    log_ratio = (new_logprobs - old_logprobs.to(new_logprobs.dtype)) * mask
    ratio = torch.exp(log_ratio)
    adv = advantages.to(new_logprobs.dtype).unsqueeze(1)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * adv
    per_token = -torch.minimum(unclipped, clipped) * mask
    loss = _aggregate(per_token, mask, aggregation, denominator)
    with torch.no_grad():
        n = mask.sum().clamp(min=1.0)
        stats = {
            "clip_frac": float(((clipped < unclipped).to(mask.dtype) * mask).sum() / n),
            "approx_kl": float(((ratio - 1.0 - log_ratio) * mask).sum() / n),
            "ratio_mean": float((ratio * mask).sum() / n),
        }
    return loss, stats


def _aggregate(per_token: torch.Tensor, mask: torch.Tensor, aggregation: Aggregation,
               denominator: float | None) -> torch.Tensor:
    if aggregation == "token_mean":
        count = mask.sum() if denominator is None else denominator
        return per_token.sum() / max(float(count), 1.0)
    if aggregation == "seq_mean":
        lengths = mask.sum(dim=1)
        per_seq = per_token.sum(dim=1) / lengths.clamp(min=1.0)
        count = (lengths > 0).sum() if denominator is None else denominator
        return per_seq.sum() / max(float(count), 1.0)
    raise ValueError(f"aggregation must be 'token_mean' or 'seq_mean', got {aggregation!r}")
