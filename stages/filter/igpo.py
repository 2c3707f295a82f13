"""IGPO: information-gain turn rewards for multi-turn agents (Wang et al. 2025, "Information
Gain-based Policy Optimization: A Simple and Effective Approach for Multi-Turn LLM Agents").

Each turn's intrinsic reward is the marginal increase, over the turn, of the policy's
own probability of producing the ground-truth answer: with ``P_t`` the teacher-forced
probability of the answer's tokens after the trajectory's first ``t`` steps (the
geometric mean of their token probabilities, ``exp(mean log p)``; a step is a policy
turn with the observation that answers it),

    r_t = P_{t+1} - P_t          for every step but the last,
    r_T = the row's reward       (the outcome) for the last.

The rewards of all steps of a group's trajectories are normalised together (z-score),
and each step's advantage is the discounted sum of the normalised rewards from it on,
``A_t = sum_{k >= t} gamma^(k - t) r~_k``, written per turn as
:data:`gfcr.core.rollout.TURN_ADVANTAGES` (the trainer gives a turn's tokens its value). The
dense rewards are kept on the policy turns' ``reward`` (gfcr.core.trajectory.TURN_TYPE), so the
``turns`` view shows them.

Teacher forcing is the learner's (``ctx.teacher``, gfcr.core.stage.Teacher: the current
weights, in the loop's process), so the stage runs where the learner is, not on engine
workers.

Departures: the answer is scored as ``answer_format`` filled with the row's ``answer``
(IGPO's own template wraps it in its answer tags); the normalisation uses the sample
standard deviation with GRPO's 1e-6 (stages.advantages.grpo); ``measure="logprob"`` is
offered besides the paper's probability (gains in mean log-probability, which do not
vanish when the answer is unlikely).

>>> IGPO(gamma=1.0)  # doctest: +ELLIPSIS
IGPO(name=None, type='igpo', gamma=1.0, measure='prob', answer_format='{answer}', temperature=1.0)
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, Literal

import numpy as np
import pyarrow as pa
from pydantic import Field, field_validator

from gfcr.core.rollout import TURN_ADVANTAGES, col
from gfcr.core.trajectory import TURNS_TYPE
from gfcr.core.stage import FilterResult, StageSpec, StepContext, Teacher
from gfcr.core.registry import register
from stages.advantages import grpo
from stages.filter._table import set_column
from stages.filter._turns import discounted, policy_turns
from stages.filter.gigpo import TURN_ADVANTAGES_TYPE


@register("filter")
class IGPO(StageSpec):
    """Per-turn information-gain rewards and their discounted, group-normalised advantages
    (see the module docstring)."""

    type: Literal["igpo"] = "igpo"
    gamma: float = Field(1.0, ge=0.0, le=1.0)
    """Discount of the turn rewards (the paper's gamma)."""
    measure: Literal["prob", "logprob"] = "prob"
    """The answer's probability (``prob``, the paper's) or its mean log-probability."""
    answer_format: str = "{answer}"
    """How the answer is written when scored: the row's ``answer`` fills ``{answer}``."""
    temperature: float = Field(1.0, gt=0.0, le=100.0)
    """Temperature of the teacher-forced pass (the sampling one: ``log_softmax(z / T)``)."""

    reads: ClassVar[frozenset[str]] = frozenset({col.REWARD, col.GROUP_ID, col.ANSWER})
    writes: ClassVar[frozenset[str]] = frozenset({TURN_ADVANTAGES})

    @field_validator("answer_format")
    @classmethod
    def _has_slot(cls, value: str) -> str:
        if "{answer}" not in value:
            raise ValueError(f"answer_format={value!r} must contain '{{answer}}'")
        return value

    def apply(self, ctx: StepContext, rollouts: pa.Table) -> FilterResult:
        if ctx.teacher is None:
            raise ValueError(f"stage {self.label!r}: IGPO scores turns with the learner's "
                             "teacher forcing (ctx.teacher), which this context lacks: run "
                             "it in the loop's process, not on engine workers")
        rows = rollouts.select([col.TURNS, col.REWARD, col.GROUP_ID, col.ANSWER,
                                col.KEPT]).to_pylist()
        scored = [i for i, r in enumerate(rows) if r[col.KEPT] and r[col.REWARD] is not None
                  and r[col.TURNS] and r[col.ANSWER] is not None
                  and policy_turns(r[col.TURNS])]
        rewards = {i: self._turn_rewards(ctx.teacher, rows[i]) for i in scored}
        advantages = self._advantages(rows, rewards)
        turns = [r[col.TURNS] for r in rows]
        for i, values in rewards.items():
            for k, v in zip(policy_turns(turns[i]), values):
                turns[i][k] = {**turns[i][k], "reward": v}
        table = set_column(rollouts, col.TURNS, pa.array(turns, TURNS_TYPE))
        return FilterResult(set_column(table, TURN_ADVANTAGES,
                                       pa.array(advantages, TURN_ADVANTAGES_TYPE)))

    def _turn_rewards(self, teacher: Teacher, row: dict[str, Any]) -> list[float]:
        """Per step: the gain in the answer's measure over it; the outcome for the last."""
        turns = row[col.TURNS]
        steps = policy_turns(turns)
        answer = teacher.encode(self.answer_format.format(answer=row[col.ANSWER]))
        contexts = [[i for t in turns[:k] for i in t["token_ids"] or []] for k in steps]
        measured = [self._measure(lp) for lp in
                    teacher.logprobs(contexts, [answer] * len(contexts), self.temperature)]
        gains = [measured[j + 1] - measured[j] for j in range(len(steps) - 1)]
        return gains + [float(row[col.REWARD])]

    def _measure(self, logprobs: list[float]) -> float:
        mean = float(np.mean(logprobs)) if logprobs else 0.0
        return math.exp(mean) if self.measure == "prob" else mean

    def _advantages(self, rows: list[dict[str, Any]], rewards: dict[int, list[float]]
                    ) -> list[list[float | None] | None]:
        """Per row, the discounted sums of its steps' group-normalised rewards on its
        policy turns (null elsewhere, and for rows not scored)."""
        out: list[list[float | None] | None] = [None] * len(rows)
        order = list(rewards)
        if not order:
            return out
        flat = np.asarray([v for i in order for v in rewards[i]], np.float64)
        groups = np.asarray([rows[i][col.GROUP_ID] for i in order for _ in rewards[i]])
        normalised = iter(grpo(flat, groups).tolist())
        for i in order:
            values = discounted([next(normalised) for _ in rewards[i]], self.gamma)
            row: list[float | None] = [None] * len(rows[i][col.TURNS])
            for k, v in zip(policy_turns(rows[i][col.TURNS]), values):
                row[k] = v
            out[i] = row
        return out
