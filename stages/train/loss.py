"""The clipped policy-gradient loss of PPO/GRPO and its optional terms, as pure torch
functions.

PPO (Schulman et al. 2017) clipped surrogate per completion token t of sequence i, with
ratio rho = exp(logp_new - logp_old) against the behaviour (or proximal) policy:

    pg_{i,t} = -w_{i,t} * min(rho * A_i, clip(rho, 1 - clip_low, 1 + clip_high) * A_i)

``clip_high > clip_low`` is DAPO's clip-higher (Yu et al. 2025): a positive-advantage
token is clipped at 1 + clip_high, a negative one at 1 - clip_low. ``w`` are optional
off-policy importance weights (:func:`truncated_is_weights`), 1 by default.
``ratio_level="sequence"`` replaces rho by GSPO's per-sequence ratio (Zheng et al. 2025).

Optional terms, per token and aggregated the same way as pg:

    l_{i,t} = pg_{i,t} + kl_coef * k3_{i,t} - entropy_coef * H_{i,t}

with k3 the KL estimator to a frozen reference policy (:func:`k3_kl`) and H the
per-token entropy (:func:`token_entropy`). Aggregation of l over the [B, T] batch:

- ``seq_mean``: mean over sequences of the per-sequence token mean (GRPO, Shao et al. 2024);
- ``token_mean``: sum over all tokens / number of tokens (DAPO), so long sequences are not
  down-weighted;
- ``seq_mean_token_sum_norm``: per-sequence token *sum* divided by one constant, then
  mean over sequences (Dr. GRPO, Liu et al. 2025; verl's "seq-mean-token-sum-norm"): every
  token weighs the same whatever its sequence's length, and the scale does not depend on
  the batch's lengths when the constant is the generation budget ``max_tokens``.
"""

from __future__ import annotations

from typing import Any, Literal

import torch

Aggregation = Literal["token_mean", "seq_mean", "seq_mean_token_sum_norm"]
RatioLevel = Literal["token", "sequence"]
AGGREGATIONS = ("token_mean", "seq_mean", "seq_mean_token_sum_norm")


def policy_loss(new_logprobs: torch.Tensor, old_logprobs: torch.Tensor,
                advantages: torch.Tensor, mask: torch.Tensor,
                **options: Any) -> tuple[torch.Tensor, dict[str, float]]:
    """:func:`policy_loss_terms` with its statistics as floats (one host sync each: for
    callers outside a training loop; the learner keeps the tensors)."""
    loss, stats = policy_loss_terms(new_logprobs, old_logprobs, advantages, mask, **options)
    return loss, {key: float(value) for key, value in stats.items()}


def policy_loss_terms(new_logprobs: torch.Tensor, old_logprobs: torch.Tensor,
                      advantages: torch.Tensor, mask: torch.Tensor, *,
                      clip_low: float = 0.2, clip_high: float = 0.2,
                      aggregation: Aggregation = "seq_mean",
                      denominator: float | None = None, max_tokens: int | None = None,
                      ratio_level: RatioLevel = "token",
                      is_weights: torch.Tensor | None = None,
                      ref_logprobs: torch.Tensor | None = None, kl_coef: float = 0.0,
                      entropy: torch.Tensor | None = None, entropy_coef: float = 0.0,
                      ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped surrogate loss (plus optional KL and entropy terms) and its statistics.

    Shapes: ``new_logprobs``, ``old_logprobs``, ``mask`` and the optional ``is_weights``,
    ``ref_logprobs``, ``entropy``: [B, T] (mask true on real completion tokens);
    ``advantages``: [B], one per sequence, or [B, T], one per token (per-turn credit,
    gfcr.core.rollout.TURN_ADVANTAGES). ``denominator`` overrides the count the sum is
    divided by (tokens for token_mean, non-empty sequences otherwise): pass the whole
    batch's count when accumulating gradients over micro-batches, so the micro-batch
    losses add up to the full-batch loss. ``max_tokens`` is the seq_mean_token_sum_norm
    constant (the generation budget); without it the batch's longest sequence is used,
    which differs between micro-batches (only used by that aggregation).

    ``is_weights`` multiply the pg term only; they and ``ref_logprobs`` are detached. ``ref_logprobs`` are needed
    when ``kl_coef != 0``, ``entropy`` when ``entropy_coef != 0``; given with a zero
    coefficient they are only measured.

    Statistics (0-d tensors on the loss's device, over masked tokens): ``clip_frac`` (tokens whose clipped term is
    the active one), ``approx_kl`` (k3 estimator of KL(old || new), Schulman 2020:
    mean of rho - 1 - log rho, per token even with ``ratio_level="sequence"``),
    ``ratio_mean`` (of the ratio the surrogate used); ``kl_ref`` (mean k3 to the
    reference) when ``ref_logprobs`` is given and ``entropy`` (mean H) when ``entropy`` is.
    """
    _check(new_logprobs, old_logprobs, advantages, mask,
           is_weights=is_weights, ref_logprobs=ref_logprobs, entropy=entropy)
    _check_options(aggregation, ratio_level, max_tokens, kl_coef, ref_logprobs,
                   entropy_coef, entropy)
    dtype = new_logprobs.dtype
    mask = mask.bool()
    maskf = mask.to(dtype)
    log_ratio = _masked(new_logprobs - old_logprobs.to(dtype), mask)
    ratio, surrogate, clipped = _surrogate(log_ratio, maskf, advantages.to(dtype),
                                           clip_low, clip_high, ratio_level)
    per_token = _masked(-surrogate, mask)
    if is_weights is not None:
        per_token = _masked(per_token * is_weights.detach().to(dtype), mask)
    kl = entropy_term = None
    if ref_logprobs is not None:
        kl = k3_kl(new_logprobs, ref_logprobs.detach().to(dtype), mask)
        per_token = per_token + kl_coef * kl
    if entropy is not None:
        entropy_term = _masked(entropy.to(dtype), mask)
        per_token = per_token - entropy_coef * entropy_term
    loss = _aggregate(per_token, maskf, aggregation, denominator, max_tokens)
    return loss, _statistics(mask, log_ratio, ratio, clipped, kl, entropy_term)


@torch.no_grad()
def _statistics(mask: torch.Tensor, log_ratio: torch.Tensor, ratio: torch.Tensor,
                clipped: torch.Tensor, kl: torch.Tensor | None,
                entropy: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """policy_loss's statistics: means over the masked tokens, as 0-d tensors (no sync)."""
    n = mask.sum().clamp(min=1).to(ratio.dtype)
    stats = {
        "clip_frac": _masked(clipped.to(ratio.dtype), mask).sum() / n,
        "approx_kl": _masked(log_ratio.exp() - 1.0 - log_ratio, mask).sum() / n,
        "ratio_mean": _masked(ratio, mask).sum() / n,
    }
    if kl is not None:
        stats["kl_ref"] = kl.sum() / n
    if entropy is not None:
        stats["entropy"] = entropy.sum() / n
    return stats


def _masked(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``values`` where ``mask``, exactly 0 elsewhere. Selecting, not multiplying by the
    mask: a -inf or nan at a padded position (a -inf logprob there, say) times 0 is nan,
    in the value and in the gradient."""
    return torch.where(mask, values, torch.zeros_like(values))


def _surrogate(log_ratio: torch.Tensor, maskf: torch.Tensor, advantages: torch.Tensor,
               clip_low: float, clip_high: float, level: RatioLevel
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ratio, min(rho A, clip(rho) A), clipped-term-active), each [B, T]; the ratio and
    the mask carry no gradient.

    ``level="sequence"`` is GSPO (Zheng et al. 2025, "Group Sequence Policy Optimization",
    eq. 5-7): the length-normalised sequence likelihood ratio

        s_i = exp(1/|y_i| sum_t (logp_new - logp_old))

    is clipped per sequence and broadcast to the sequence's tokens, so with
    ``aggregation="seq_mean"`` the loss is exactly the paper's objective
    -1/G sum_i min(s_i A_i, clip(s_i) A_i); each token's gradient is s_i A_i / |y_i|.
    Since s_i is a geometric mean of token ratios it stays close to 1: GSPO uses clip
    ranges about three orders of magnitude smaller than PPO's (3e-4 low, 4e-4 high in
    the paper), so pass those, not the token-level 0.2.

    Where the clipped term is the smaller one (or A = 0) the objective is a constant and
    its gradient 0, as in PPO; the unclipped term is then evaluated at ratio 1, so a ratio
    that overflows (exp(89) is inf in float32) gives a zero gradient, not inf * 0 = nan.
    """
    if level == "sequence":
        lengths = maskf.sum(dim=1).clamp(min=1.0)
        log_ratio = (log_ratio.sum(dim=1) / lengths).unsqueeze(1).expand_as(log_ratio)
    adv = advantages.unsqueeze(1) if advantages.ndim == 1 else advantages
    with torch.no_grad():
        ratio = torch.exp(log_ratio)
        clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * adv
        constant = (clipped < ratio * adv) | (adv == 0)
    safe = torch.where(constant, torch.zeros_like(log_ratio), log_ratio)
    surrogate = torch.where(constant, clipped, torch.exp(safe) * adv)
    return ratio, surrogate, constant & (adv != 0)


def _aggregate(per_token: torch.Tensor, maskf: torch.Tensor, aggregation: Aggregation,
               denominator: float | None, max_tokens: int | None) -> torch.Tensor:
    if aggregation == "token_mean":
        count = maskf.sum() if denominator is None else denominator
        return per_token.sum() / max(float(count), 1.0)
    lengths = maskf.sum(dim=1)
    if aggregation == "seq_mean":
        per_seq = per_token.sum(dim=1) / lengths.clamp(min=1.0)
    else:  # seq_mean_token_sum_norm
        longest = float(lengths.max()) if lengths.numel() else 0.0
        norm = float(max_tokens) if max_tokens is not None else longest
        per_seq = per_token.sum(dim=1) / max(norm, 1.0)
    count = (lengths > 0).sum() if denominator is None else denominator
    return per_seq.sum() / max(float(count), 1.0)


def k3_kl(new_logprobs: torch.Tensor, ref_logprobs: torch.Tensor,
          mask: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimator of KL(new || ref) (Schulman 2020, "Approximating KL
    Divergence"), with x = logp_ref - logp_new at the sampled token:

        k3 = exp(x) - x - 1   (>= 0 for every x, 0 iff ref == new)

    Unbiased for KL(new || ref) on tokens sampled from ``new`` and of low variance, as in
    GRPO's KL term (Shao et al. 2024, eq. 4). [B, T], 0 on padding; differentiable in
    ``new_logprobs`` (d k3 / d logp_new = 1 - exp(x)). ``ref_logprobs`` come from the
    frozen reference model and should carry no gradient.
    """
    if new_logprobs.shape != ref_logprobs.shape or new_logprobs.shape != mask.shape:
        raise ValueError(f"k3_kl: new_logprobs {tuple(new_logprobs.shape)}, ref_logprobs "
                         f"{tuple(ref_logprobs.shape)} and mask {tuple(mask.shape)} must match")
    mask = mask.bool()
    x = _masked(ref_logprobs.to(new_logprobs.dtype) - new_logprobs, mask)
    return _masked(torch.exp(x) - x - 1.0, mask)


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy H = -sum_v p_v log p_v of the next-token distribution softmax(logits) at
    each position: [..., V] -> [...]. Pass the logits already divided by the sampling
    temperature; -inf logits (masked vocabulary) count as probability 0. Differentiable,
    so ``policy_loss(entropy=..., entropy_coef=c)`` raises the policy's entropy (the
    entropy bonus of A3C, Mnih et al. 2016, and PPO eq. 9)."""
    if logits.ndim < 1 or logits.shape[-1] < 1:
        raise ValueError(f"token_entropy: logits {tuple(logits.shape)} need a last "
                         "(vocabulary) dimension")
    logp = torch.log_softmax(logits, dim=-1)
    p = logp.exp()
    # 0 log 0 = 0: masked (-inf) logits must not turn the sum into nan
    return -(p * torch.where(p > 0, logp, torch.zeros_like(logp))).sum(dim=-1)


def truncated_is_weights(proximal_logprobs: torch.Tensor, behaviour_logprobs: torch.Tensor,
                         mask: torch.Tensor, cap: float
                         ) -> tuple[torch.Tensor, dict[str, float]]:
    """Truncated importance weights for rollouts sampled by a stale or mismatched behaviour
    policy (the truncated IS of IMPALA's V-trace, Espeholt et al. 2018; the decoupled PPO
    objective of Hilton et al. 2022 as AReaL uses it, Fu et al. 2025; verl's TIS, Yao et
    al. 2025, "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training"):

        w_{i,t} = min(exp(logp_prox - logp_behav), cap)

    Pass ``w`` as ``policy_loss(is_weights=...)`` with ``old_logprobs`` set to the
    proximal (recomputed, pre-update) logprobs, so the clip trust region is around the
    proximal policy and the weights correct the sampling mismatch. [B, T], 0 on padding,
    no gradient. Statistics over masked tokens: ``is_weight_mean`` (after truncation),
    ``is_truncated_frac`` (share with exp(...) > cap) and ``is_log_ratio_max``.
    """
    if proximal_logprobs.shape != behaviour_logprobs.shape or \
            proximal_logprobs.shape != mask.shape:
        raise ValueError(f"truncated_is_weights: proximal_logprobs "
                         f"{tuple(proximal_logprobs.shape)}, behaviour_logprobs "
                         f"{tuple(behaviour_logprobs.shape)} and mask {tuple(mask.shape)} "
                         "must match")
    if not cap > 0:
        raise ValueError(f"truncated_is_weights: cap must be > 0, got {cap!r}")
    with torch.no_grad():
        mask = mask.bool()
        log_ratio = (proximal_logprobs - behaviour_logprobs.to(proximal_logprobs.dtype))
        log_ratio = log_ratio.masked_fill(~mask, 0.0)
        raw = torch.exp(log_ratio)
        weights = raw.clamp(max=cap).masked_fill(~mask, 0.0)
        n = max(float(mask.sum()), 1.0)
        stats = {
            "is_weight_mean": float(weights.sum() / n),
            "is_truncated_frac": float(((raw > cap) & mask).sum() / n),
            "is_log_ratio_max": float(log_ratio[mask].max()) if mask.any() else 0.0,
        }
    return weights, stats


def _check(new: torch.Tensor, old: torch.Tensor, advantages: torch.Tensor,
           mask: torch.Tensor, **optional: torch.Tensor | None) -> None:
    """Shapes; the ValueError names the argument."""
    if new.ndim != 2 or old.shape != new.shape or mask.shape != new.shape:
        raise ValueError(f"new_logprobs {tuple(new.shape)}, old_logprobs "
                         f"{tuple(old.shape)} and mask {tuple(mask.shape)} must match "
                         "and be [B, T]")
    if advantages.shape != new.shape[:1] and advantages.shape != new.shape:
        raise ValueError(f"advantages {tuple(advantages.shape)} must have one entry per "
                         f"sequence ({new.shape[0]}) or per token {tuple(new.shape)}")
    for name, value in optional.items():
        if value is not None and value.shape != new.shape:
            raise ValueError(f"{name} {tuple(value.shape)} must match new_logprobs "
                             f"{tuple(new.shape)}")


def _check_options(aggregation: str, ratio_level: str, max_tokens: int | None,
                   kl_coef: float, ref_logprobs: torch.Tensor | None,
                   entropy_coef: float, entropy: torch.Tensor | None) -> None:
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"aggregation must be one of {', '.join(map(repr, AGGREGATIONS))}, "
                         f"got {aggregation!r}")
    if ratio_level not in ("token", "sequence"):
        raise ValueError(f"ratio_level must be 'token' or 'sequence', got {ratio_level!r}")
    if max_tokens is not None and max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens!r}")
    if kl_coef != 0.0 and ref_logprobs is None:
        raise ValueError(f"kl_coef={kl_coef!r} needs ref_logprobs")
    if entropy_coef != 0.0 and entropy is None:
        raise ValueError(f"entropy_coef={entropy_coef!r} needs entropy")
