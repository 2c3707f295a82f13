"""GRPO: group-relative advantages and the clipped policy-gradient update.

GRPO (Shao et al. 2024, DeepSeekMath) without the KL term to a reference model, as DAPO
(Yu et al. 2025) and Dr. GRPO (Liu et al. 2025) also drop it. Options from those papers:
clip-higher (``clip_high > clip_low``), token-level aggregation (``"token_mean"``) and the
mean-only advantage (``advantage="drgrpo"``).

Departure: rows whose advantage is exactly 0 (flat groups, see
:mod:`stages.train.advantages`) are not forwarded at all, and the loss is averaged over the
rows that carry signal, so the step size does not shrink with the share of flat groups
(the effect DAPO's dynamic sampling has when it refills the batch).

>>> GRPO(lr=1e-3, clip_high=0.28, aggregation="token_mean")  # doctest: +ELLIPSIS
GRPO(name=None, type='grpo', lr=0.001, ...)
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import numpy as np
import pyarrow as pa
import torch
from pydantic import Field, field_validator

from gfcr.engine import Policy
from gfcr.rollout import col
from gfcr.stage import StageSpec, StepContext, TrainResult, register
from stages.engines.hf import batch_token_logprobs
from stages.train.advantages import known_advantage, lookup_advantage
from stages.train.loss import Aggregation, policy_loss


@register("train")
class GRPO(StageSpec):
    """Group-relative policy optimisation (Shao et al. 2024) with PPO clipping.

    ``temperature`` must equal the sampling temperature: the new logprobs are
    ``log_softmax(logits / T)``, the engine's convention for the behaviour logprobs.
    One optimizer step per epoch over the whole batch, accumulated over micro-batches
    of ``micro_batch`` sequences; AdamW with betas (0.9, 0.999), no weight decay.
    """

    type: Literal["grpo"] = "grpo"
    lr: float = Field(1e-4, gt=0.0)
    """Tuned for the embedded default (0.67M tiny Llama); 3e-4 and above collapsed there."""
    advantage: str = "grpo"
    """Name in the advantage registry (stages.train.advantages): grpo, drgrpo."""
    clip_low: float = Field(0.2, gt=0.0, lt=1.0)
    clip_high: float = Field(0.28, gt=0.0)
    aggregation: Aggregation = "seq_mean"
    epochs: int = Field(1, ge=1)
    micro_batch: int = Field(64, ge=1)
    max_grad_norm: float = Field(1.0, gt=0.0)
    temperature: float = Field(1.0, gt=0.0)

    reads: ClassVar[frozenset[str]] = frozenset(
        {col.REWARD, col.GROUP_ID, col.PROMPT_IDS, col.COMPLETION_IDS, col.LOGPROBS})
    writes: ClassVar[frozenset[str]] = frozenset({col.ADVANTAGE})

    @field_validator("advantage")
    @classmethod
    def _known_advantage(cls, value: str) -> str:
        return known_advantage(value)

    def learner(self, policy: Policy, *, seed: int) -> "GRPOLearner":
        """A learner with AdamW over ``policy.model`` (updated in place)."""
        return GRPOLearner(self, policy, seed=seed)


class GRPOLearner:
    """Applies :class:`GRPO` updates to a policy shared with the engine. It never touches
    the engine: the loop calls ``engine.update_weights()`` after each update."""

    def __init__(self, spec: GRPO, policy: Policy, *, seed: int) -> None:
        self.spec, self.policy, self.seed = spec, policy, seed
        self.updates = 0
        self.optimizer = torch.optim.AdamW(policy.model.parameters(), lr=spec.lr,
                                           betas=(0.9, 0.999), weight_decay=0.0)

    def update(self, ctx: StepContext, batch: pa.Table) -> TrainResult:
        """Advantages over the batch's groups, then ``epochs`` clipped-PG steps."""
        rewards = _rewards(batch)
        adv = lookup_advantage(self.spec.advantage)(
            rewards, np.asarray(batch.column(col.GROUP_ID).to_pylist()))
        rows = _active_rows(batch, adv)
        metrics = {"reward_mean": float(rewards.mean()) if len(rewards) else 0.0,
                   "adv_abs_mean": float(np.abs(adv).mean()) if len(adv) else 0.0,
                   "n_seqs": float(len(rows[0])),
                   "n_tokens": float(sum(len(c) for c in rows[1]))}
        if not rows[0]:
            metrics.update(loss=0.0, clip_frac=0.0, grad_norm=0.0, approx_kl=0.0, ratio_mean=1.0)
            return TrainResult(advantages=adv.tolist(), metrics=metrics)
        self.policy.model.train()
        epochs = [self._epoch(*rows) for _ in range(self.spec.epochs)]
        self.updates += 1
        for key in epochs[0]:
            metrics[key] = float(np.mean([e[key] for e in epochs]))
        return TrainResult(advantages=adv.tolist(), metrics=metrics)

    def _epoch(self, prompts: list[list[int]], completions: list[list[int]],
               old: list[list[float]], adv: list[float]) -> dict[str, float]:
        """One optimizer step, gradients accumulated over micro-batches."""
        spec, model = self.spec, self.policy.model
        device = next(model.parameters()).device
        if spec.aggregation == "token_mean":
            denominator = float(sum(len(c) for c in completions))
        else:
            denominator = float(sum(1 for c in completions if c))
        self.optimizer.zero_grad(set_to_none=True)
        total, weighted = 0.0, {"clip_frac": 0.0, "approx_kl": 0.0, "ratio_mean": 0.0}
        for at in range(0, len(prompts), spec.micro_batch):
            part = slice(at, at + spec.micro_batch)
            new, mask = sequence_logprobs(model, prompts[part], completions[part],
                                          spec.temperature, self.policy.tokenizer.pad_token_id)
            loss, stats = policy_loss(
                new, _padded(old[part], mask.shape, device),
                torch.tensor(adv[part], dtype=torch.float32, device=device), mask,
                clip_low=spec.clip_low, clip_high=spec.clip_high,
                aggregation=spec.aggregation, denominator=denominator)
            loss.backward()
            total += loss.item()
            n = float(mask.sum())
            for key in weighted:
                weighted[key] += stats[key] * n
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), spec.max_grad_norm)
        self.optimizer.step()
        n_tokens = max(float(sum(len(c) for c in completions)), 1.0)
        return {"loss": total, "grad_norm": float(grad_norm),
                **{k: v / n_tokens for k, v in weighted.items()}}

    def state_dict(self) -> dict[str, Any]:
        """Model weights, optimizer state and the update count."""
        return {"model": self.policy.model.state_dict(),
                "optimizer": self.optimizer.state_dict(), "updates": self.updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.policy.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.updates = int(state["updates"])


# --------------------------------------------------------------------------- logprobs

_MIN_SHARED = 8
"""Shortest common prompt prefix worth a separate forward pass."""


def sequence_logprobs(model: Any, prompts: list[list[int]], completions: list[list[int]],
                      temperature: float = 1.0, pad_id: int = 0
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """Teacher-forced ``log_softmax(logits / T)`` (raw logits for ``T == 0``) of each
    completion token: the engine's convention (:func:`stages.engines.hf.batch_token_logprobs`,
    same shapes and values).

    The prompts' longest common token prefix is run once and its KV cache repeated over
    the batch (the shared-prefix forward of "Prefix Grouper", 2025): a GRPO group
    shares its whole prompt and a task's prompts often share a template, so this saves
    most of the compute on short completions. Gradients flow through the shared part.
    Falls back to one right-padded pass when the prefix is short or the model's cache
    cannot be repeated.
    """
    k = _common_prefix(prompts)
    if k < _MIN_SHARED or len(prompts) < 2:
        return batch_token_logprobs(model, prompts, completions, temperature, pad_id)
    device = next(model.parameters()).device
    shared = model(input_ids=torch.tensor([prompts[0][:k]], device=device), use_cache=True)
    cache = shared.past_key_values
    if not hasattr(cache, "batch_repeat_interleave"):
        return batch_token_logprobs(model, prompts, completions, temperature, pad_id)
    cache.batch_repeat_interleave(len(prompts))
    ids, attn, width = _suffix_batch(prompts, completions, k, pad_id)
    positions = torch.arange(k, k + width, device=device).expand(len(prompts), -1)
    logits = model(input_ids=ids.to(device), attention_mask=attn.to(device),
                   position_ids=positions, past_key_values=cache, use_cache=True).logits
    n_out = max(len(c) for c in completions)
    starts = torch.tensor([len(p) - k - 1 for p in prompts], device=device)
    where = (starts[:, None] + torch.arange(n_out, device=device)[None, :]).clamp(max=width - 1)
    picked = logits.gather(1, where[:, :, None].expand(-1, -1, logits.shape[-1])).float()
    targets = torch.zeros((len(prompts), n_out), dtype=torch.long)
    mask = torch.zeros((len(prompts), n_out), dtype=torch.bool)
    for i, c in enumerate(completions):
        targets[i, :len(c)] = torch.tensor(list(c), dtype=torch.long)
        mask[i, :len(c)] = True
    targets, mask = targets.to(device), mask.to(device)
    logprobs = torch.log_softmax(picked / temperature if temperature > 0 else picked, dim=-1)
    logprobs = logprobs.gather(-1, targets[:, :, None]).squeeze(-1)
    return logprobs.masked_fill(~mask, 0.0), mask


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


def _rewards(batch: pa.Table) -> np.ndarray:
    column = batch.column(col.REWARD)
    if column.null_count:
        raise ValueError(f"grpo: {column.null_count} batch row(s) have a null {col.REWARD!r}; "
                         "a Filter must score every row the learner trains on")
    return column.to_numpy(zero_copy_only=False).astype(np.float64)


def _active_rows(batch: pa.Table, adv: np.ndarray) -> tuple[list, list, list, list]:
    """(prompt ids, completion ids, behaviour logprobs, advantage) of rows with A != 0
    and at least one completion token."""
    out: tuple[list, list, list, list] = ([], [], [], [])
    prompts = batch.column(col.PROMPT_IDS).to_pylist()
    completions = batch.column(col.COMPLETION_IDS).to_pylist()
    logprobs = batch.column(col.LOGPROBS).to_pylist()
    for i in np.flatnonzero(adv != 0.0):
        if len(logprobs[i]) != len(completions[i]):
            raise ValueError(f"grpo: batch row {int(i)!r} has {len(completions[i])!r} "
                             f"completion ids but {len(logprobs[i])!r} logprobs")
        if completions[i]:
            for seq, value in zip(out, (prompts[i], completions[i], logprobs[i], adv[i])):
                seq.append(value)
    return out


def _padded(rows: list[list[float]], shape: torch.Size, device: torch.device) -> torch.Tensor:
    out = torch.zeros(shape, dtype=torch.float32)
    for i, r in enumerate(rows):
        out[i, :len(r)] = torch.tensor(r, dtype=torch.float32)
    return out.to(device)
