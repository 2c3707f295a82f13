"""The rows one GRPO update trains on (stages.train.learner): which rows, their rewards,
and the whole-batch counts the loss is divided by."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from gfcr.core.rollout import col
from stages.advantages import READS_COMPONENTS, lookup_advantage
from stages.reward_components import reward_components
from stages.train.batching import padded
from stages.train.loss import Aggregation, policy_loss_terms, truncated_is_weights


@dataclass
class Work:
    """The rows one update trains on, aligned lists (one entry per row)."""

    prompts: list[list[int]] = field(default_factory=list)
    completions: list[list[int]] = field(default_factory=list)
    adv: list[float] = field(default_factory=list)
    masks: list[np.ndarray] = field(default_factory=list)
    """Loss masks (forced tokens out, the token selector applied)."""
    old: list[np.ndarray] = field(default_factory=list)
    """Logprobs the ratio is taken against: behaviour, or proximal for off-policy rows."""
    weights: list[np.ndarray] | None = None
    """Truncated IS weights (ones on on-policy rows); None when no row is off-policy."""
    ref: list[np.ndarray] | None = None
    """Reference-model logprobs, when ``kl_coef > 0``."""
    token_adv: list[np.ndarray] | None = None
    """Per-token advantages (per-turn credit, stages.train.masks.BatchMarks); None:
    ``adv``, one per row."""
    metrics: dict[str, float] = field(default_factory=dict)
    plans: dict[tuple[int, ...], list[list[int]]] = field(default_factory=dict)
    """Micro-batches already planned, by the rows they cut (stages.train.batching.plan)."""


def rewards(batch: pa.Table, label: str) -> np.ndarray:
    column = batch.column(col.REWARD)
    if column.null_count:
        raise ValueError(f"{label}: {column.null_count} batch row(s) have a null "
                         f"{col.REWARD!r}; a Filter must score every row the learner "
                         "trains on")
    return column.to_numpy(zero_copy_only=False).astype(np.float64)


def active_rows(batch: pa.Table, adv: np.ndarray, label: str, every: bool,
                masks: list[np.ndarray]) -> tuple[list[int], list[list[int]], list[list[int]],
                                                  list[np.ndarray], list[np.ndarray]]:
    """(batch row, prompt ids, completion ids, behaviour logprobs, loss mask) of rows with
    A != 0 (or, when ``every``, of all rows: a KL or entropy term gives A = 0 rows a
    gradient) and at least one loss token (``masks``: every batch row's,
    stages.train.masks.for_batch)."""
    out: tuple[list, list, list, list, list] = ([], [], [], [], [])
    prompts = batch.column(col.PROMPT_IDS).to_pylist()
    completions = batch.column(col.COMPLETION_IDS).to_pylist()
    logprobs = batch.column(col.LOGPROBS).to_pylist()
    for i in (np.arange(len(adv)) if every else np.flatnonzero(adv != 0.0)):
        if len(logprobs[i]) != len(completions[i]):
            raise ValueError(f"{label}: batch row {int(i)!r} has {len(completions[i])!r} "
                             f"completion ids but {len(logprobs[i])!r} logprobs")
        if completions[i] and masks[i].any():
            for seq, value in zip(out, (int(i), prompts[i], completions[i],
                                        np.asarray(logprobs[i], np.float32), masks[i])):
                seq.append(value)
    return out


def drop_empty(work: Work) -> None:
    """Remove rows left without a loss token (a token selector may empty a row)."""
    keep = [i for i, m in enumerate(work.masks) if m.any()]
    if len(keep) == len(work.masks):
        return
    work.prompts = [work.prompts[i] for i in keep]
    work.completions = [work.completions[i] for i in keep]
    work.adv = [work.adv[i] for i in keep]
    work.masks = [work.masks[i] for i in keep]
    work.old = [work.old[i] for i in keep]
    if work.weights is not None:
        work.weights = [work.weights[i] for i in keep]
    if work.token_adv is not None:
        work.token_adv = [work.token_adv[i] for i in keep]


def denominator(work: Work, aggregation: Aggregation) -> float:
    """The whole batch's count: loss tokens (token_mean) or rows with a loss token."""
    if aggregation == "token_mean":
        return float(sum(int(m.sum()) for m in work.masks))
    return float(sum(1 for m in work.masks if m.any()))


def norm(work: Work, aggregation: Aggregation, norm_tokens: int | None) -> int | None:
    """The seq_mean_token_sum_norm constant: ``norm_tokens`` or the longest completion."""
    if aggregation != "seq_mean_token_sum_norm":
        return None
    return norm_tokens or max(len(c) for c in work.completions)


def is_weights(work: Work, behaviour: list[np.ndarray], off: np.ndarray,
               cap: float) -> list[np.ndarray]:
    """Truncated IS weights per row: min(pi_prox / pi_behav, ``cap``) on off-policy rows
    (``work.old`` holds their proximal logprobs), exactly 1 on the others."""
    out = [np.ones(len(m)) for m in work.masks]
    picked = [i for i in range(len(off)) if off[i]]
    if not picked:
        return out
    width = max(len(work.masks[i]) for i in picked)
    weights, _ = truncated_is_weights(
        padded([work.old[i] for i in picked], width),
        padded([behaviour[i] for i in picked], width),
        padded([work.masks[i] for i in picked], width, dtype=torch.bool), cap)
    for j, i in enumerate(picked):
        out[i] = weights[j, :len(work.masks[i])].double().numpy()
    return out


def advantages_of(work: Work, part: list[int], width: int, device: torch.device) -> torch.Tensor:
    """The rows' advantages: [B] one per row, or [B, T] per token (per-turn credit)."""
    if work.token_adv is not None:
        return padded([work.token_adv[i] for i in part], width, device=device)
    return torch.tensor([work.adv[i] for i in part], dtype=torch.float32, device=device)


def values_of(values: list[np.ndarray] | None, part: list[int], width: int,
              device: torch.device) -> torch.Tensor | None:
    """The rows' per-token values (IS weights, reference logprobs), padded; None: none."""
    return None if values is None else padded([values[i] for i in part], width, device=device)


def estimated_advantages(batch: pa.Table, rewards: np.ndarray, advantage: str,
                         label: str) -> np.ndarray:
    """The estimator ``advantage``'s advantages over the batch's groups (with the
    ``rewards`` components for an estimator that reads them)."""
    estimator = lookup_advantage(advantage)
    groups = np.asarray(batch.column(col.GROUP_ID).to_pylist())
    components = None
    if advantage in READS_COMPONENTS and col.REWARDS in batch.column_names:
        entries = batch.column(col.REWARDS).to_pylist()
        if any(entries):  # none: the scalar reward is the one component
            try:
                components = reward_components(entries)[1]
            except ValueError as err:
                raise ValueError(f"stage {label!r}: advantage={advantage!r} needs the "
                                 f"same reward components on every row: {err}") from None
    return np.asarray(estimator(rewards, groups, components), dtype=np.float64)


def micro_loss(work: Work, part: list[int], new: torch.Tensor, entropy: torch.Tensor | None,
               **options: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The loss of the micro-batch ``part`` (new logprobs ``new``, ``[B, T]``) against its
    rows' old logprobs, advantages, masks and, when the work has them, IS weights and
    reference logprobs: :func:`stages.train.loss.policy_loss_terms` with ``options``."""
    width, device = new.shape[1], new.device
    mask = padded([work.masks[i] for i in part], width, dtype=torch.bool, device=device)
    return policy_loss_terms(
        new, padded([work.old[i] for i in part], width, device=device),
        advantages_of(work, part, width, device), mask,
        is_weights=values_of(work.weights, part, width, device),
        ref_logprobs=values_of(work.ref, part, width, device), entropy=entropy, **options)
