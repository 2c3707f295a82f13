"""GiGPO: group-in-group advantages for multi-turn agents (Feng et al. 2025, "Group-in-Group
Policy Optimization for LLM Agent Training").

Two levels of relative advantage, both critic-free:

- **Episode level**: each trajectory's return R_i against its group's (the GRPO
  advantage, A^E_i = (R_i - mean) / std, or R_i - mean without normalisation).
- **Step level**: steps (policy turns) taken from the same *anchor state* in any of the
  group's trajectories form a step group, found after the fact with no extra rollouts.
  Each step's discounted return G_t = sum_k gamma^k r_{t+k} is compared within its step
  group: A^S = (G - mean) / std (or G - mean). A step group of one gets A^S = 0.

Each policy turn's advantage is ``A^E_i + omega * A^S_{i,t}``, written per turn as
:data:`gfcr.core.rollout.TURN_ADVANTAGES` (null for turns that are not the policy's); the
trainer gives every loss token of a turn its turn's value (stages.train.masks).

Departures from the paper: the anchor state is the exact token ids of the observation
the step saw (the non-policy turns since the previous step: the prompt for the first
step, the environment's and tools' answers later), hashed; GiGPO compares environment
states, which an environment whose text does not determine its state would conflate or
split. Step rewards are the turns' own rewards (gfcr.core.trajectory.TURN_TYPE ``reward``) with
whatever of the row's ``reward`` they do not account for earned at the last step
(stages.filter._turns.step_rewards); GiGPO's environments give them per step. The
standard deviations are the sample ones (ddof=1) with GRPO's 1e-6, as the trainer's
``grpo`` estimator (stages.advantages) computes them.

When it helps: where trajectories meet the same state again with different futures
(the paper's ALFWorld rooms and WebShop pages). In two-turn episodes rewarded at the end
(a tool call, then an answer: ``smol-agent``) a tool's answer recurs only for episodes
that ran the same code, which mostly answer alike, so nearly every step group after the
prompt is a singleton or shares one return: the advantages are nearly GRPO's with the
first turn's weighted ``1 + omega``, and on that task it trained as GRPO did
(BENCHMARKS.md, "Rollout effects on SmolLM2").

>>> GiGPO(omega=1.0, gamma=0.95)  # doctest: +ELLIPSIS
GiGPO(name=None, type='gigpo', omega=1.0, gamma=0.95, normalize='std')
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import numpy as np
import pyarrow as pa
from pydantic import Field

from gfcr.core.rollout import TURN_ADVANTAGES, col
from gfcr.core.stage import FilterResult, StageSpec, StepContext
from gfcr.core.registry import register
from stages.advantages import drgrpo, grpo
from stages.filter._table import set_column
from stages.filter._turns import anchor, discounted, observations, policy_turns, step_rewards

TURN_ADVANTAGES_TYPE = pa.list_(pa.float64())


@register("filter")
class GiGPO(StageSpec):
    """Write each policy turn's advantage: its episode's plus ``omega`` times its step's
    within the anchor-state group (see the module docstring)."""

    type: Literal["gigpo"] = "gigpo"
    omega: float = Field(1.0, ge=0.0, le=100.0)
    """Weight of the step-level advantage (the paper's omega; 0: GRPO per turn)."""
    gamma: float = Field(0.95, ge=0.0, le=1.0)
    """Discount of the step returns (the paper's gamma)."""
    normalize: Literal["std", "none"] = "std"
    """Divide both levels by their group's standard deviation (``std``), or only centre
    them (``none``, the paper's F_norm = 1)."""

    reads: ClassVar[frozenset[str]] = frozenset({col.REWARD, col.GROUP_ID})
    writes: ClassVar[frozenset[str]] = frozenset({TURN_ADVANTAGES})

    def apply(self, ctx: StepContext, rollouts: pa.Table) -> FilterResult:
        kept = rollouts.column(col.KEPT).to_pylist()
        rewards = [r if k else None for r, k in zip(rollouts.column(col.REWARD).to_pylist(), kept)]
        values = gigpo_advantages(rollouts.column(col.TURNS).to_pylist(), rewards,
                                  rollouts.column(col.GROUP_ID).to_pylist(),
                                  omega=self.omega, gamma=self.gamma, normalize=self.normalize)
        column = pa.array(values, TURN_ADVANTAGES_TYPE)
        return FilterResult(set_column(rollouts, TURN_ADVANTAGES, column))


def gigpo_advantages(turns: list[Any], rewards: list[float | None], groups: list[str], *,
                     omega: float, gamma: float, normalize: str
                     ) -> list[list[float | None] | None]:
    """Per row, one advantage per turn (null off the policy's turns); a row without a
    reward (unscored, or dropped: the caller passes None) or without turns gets null."""
    estimator = grpo if normalize == "std" else drgrpo
    scored = [i for i, r in enumerate(rewards) if r is not None and turns[i]]
    out: list[list[float | None] | None] = [None] * len(rewards)
    if not scored:
        return out
    episode = dict(zip(scored, estimator(np.asarray([rewards[i] for i in scored], np.float64),
                                         np.asarray([groups[i] for i in scored]))))
    steps: list[tuple[int, int]] = []           # (row, turn index) of every step
    returns: list[float] = []
    keys: list[str] = []
    for i in scored:
        obs = observations(turns[i])
        g = discounted(step_rewards(turns[i], float(rewards[i] or 0.0)), gamma)
        for j, k in enumerate(policy_turns(turns[i])):
            steps.append((i, k))
            returns.append(g[j])
            # an empty observation (two policy turns in a row) anchors nothing: a group of one
            keys.append(f"{groups[i]}\x00{anchor(obs[j]) if obs[j] else f'{i}.{k}'}")
    rows: dict[int, list[float | None]] = {i: [None] * len(turns[i]) for i in scored}
    if steps:
        for (i, k), a_s in zip(steps, estimator(np.asarray(returns, np.float64),
                                                np.asarray(keys))):
            rows[i][k] = float(episode[i] + omega * a_s)
    for i, values in rows.items():
        out[i] = values
    return out
