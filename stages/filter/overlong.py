"""Overlong handling (DAPO; Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement
Learning System at Scale", section 3.4).

A rollout cut off at the length cap is not wrong, only unfinished; rewarding it 0 punishes
reasoning that was on track and teaches the policy noise. DAPO offers two remedies:

- ``mode="drop"`` (Overlong Filtering): drop every rollout with ``finish_reason ==
  "length"``. The row stays in the store with ``drop_reason="truncated"``.
- ``mode="penalty"`` (Soft Overlong Punishment): add ``R_length`` to the reward, with
  ``L = max_tokens`` and ``B = buffer``: 0 up to ``L - B`` tokens, falling linearly to -1
  at ``L`` tokens, -1 beyond. It is added to ``reward`` and recorded as
  ``rewards[<name>]``; it needs a verifier upstream.

>>> Overlong(mode="penalty", max_tokens=512, buffer=128)  # doctest: +ELLIPSIS
Overlong(name=None, type='overlong', mode='penalty', max_tokens=512, buffer=128)
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import pyarrow as pa
from pydantic import Field, model_validator

from gfcr.core.rollout import col
from gfcr.core.stage import FilterResult, StageSpec, StepContext
from gfcr.core.registry import register


@register("filter")
class Overlong(StageSpec):
    """Drop truncated rollouts, or add DAPO's soft length penalty to the reward."""

    type: Literal["overlong"] = "overlong"
    mode: Literal["drop", "penalty"] = "drop"
    """``drop`` truncated rollouts, or add DAPO's soft overlong ``penalty`` to the reward."""
    max_tokens: int | None = Field(None, ge=1)
    """Penalty mode: DAPO's L_max, normally the generate stage's ``max_tokens``."""
    buffer: int | None = Field(None, ge=1)
    """Penalty mode: DAPO's L_cache, the tokens over which the penalty ramps to -1."""

    @model_validator(mode="after")
    def _penalty_needs_lengths(self) -> "Overlong":
        if self.mode == "penalty":
            if self.max_tokens is None or self.buffer is None:
                raise ValueError("mode='penalty' needs max_tokens and buffer")
            if self.buffer > self.max_tokens:
                raise ValueError(f"buffer={self.buffer!r} exceeds max_tokens="
                                 f"{self.max_tokens!r}")
        return self

    @property
    def reads(self) -> frozenset[str]:
        need = {col.FINISH_REASON, col.N_TOKENS}
        return frozenset(need | ({col.REWARD} if self.mode == "penalty" else set()))

    @property
    def writes(self) -> frozenset[str]:
        return frozenset({col.REWARD, col.REWARDS} if self.mode == "penalty" else set())

    def apply(self, ctx: StepContext, rollouts: pa.Table) -> FilterResult:
        if self.mode == "drop":
            truncated = [r == "length" for r in rollouts.column(col.FINISH_REASON).to_pylist()]
            return FilterResult(rollouts, keep=[not t for t in truncated], reason="truncated")
        lengths = rollouts.column(col.N_TOKENS).to_numpy(zero_copy_only=False)
        penalty = length_penalty(lengths, self.max_tokens or 0, self.buffer or 0)
        return FilterResult(add_reward(rollouts, penalty, self.label))


def length_penalty(lengths: np.ndarray, max_tokens: int, buffer: int) -> np.ndarray:
    """DAPO's R_length: 0 for ``n <= L - B``, ``(L - B - n) / B`` up to ``L``, -1 after."""
    n = np.asarray(lengths, dtype=np.float64)
    ramp = (max_tokens - buffer - n) / buffer
    return np.where(n <= max_tokens - buffer, 0.0, np.where(n <= max_tokens, ramp, -1.0))


def add_reward(table: pa.Table, extra: np.ndarray, label: str) -> pa.Table:
    """``reward += extra`` (null rewards stay null) and ``rewards[label] = extra``."""
    reward = table.column(col.REWARD).to_numpy(zero_copy_only=False).astype(np.float64)
    entries = table.column(col.REWARDS).to_pylist()
    maps: list[Any] = []
    for i, e in enumerate(entries):
        items = [(k, v) for k, v in (e or []) if k != label]
        maps.append(items + [(label, float(extra[i]))])
    table = _put(table, col.REWARD, pa.array(reward + extra, pa.float64(),
                                             mask=np.isnan(reward)))
    return _put(table, col.REWARDS, pa.array(maps, table.schema.field(col.REWARDS).type))


def _put(table: pa.Table, name: str, values: pa.Array) -> pa.Table:
    i = table.schema.get_field_index(name)
    return table.set_column(i, table.schema.field(i), values)
