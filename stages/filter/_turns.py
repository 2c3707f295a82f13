"""Reading a trajectory's turns for the step-level operators (GiGPO, IGPO): where the
policy acted, what it observed before, what each step earned, and discounted returns.

A *step* is one policy turn (``source == "policy"``, gfcr.core.trajectory.TURN_SOURCES). Its
*observation* is every other turn since the previous step (the prompt and any forced
prefix for the first step; the environment's and the tools' answers after that).
"""

from __future__ import annotations

import hashlib
from typing import Any, Sequence

import numpy as np


def policy_turns(turns: Sequence[dict[str, Any]]) -> list[int]:
    """Indices of the policy's turns."""
    return [k for k, t in enumerate(turns) if t["source"] == "policy"]


def observations(turns: Sequence[dict[str, Any]]) -> list[list[int]]:
    """Per step, the token ids of its observation (the non-policy turns since the step
    before, in order)."""
    out: list[list[int]] = []
    seen: list[int] = []
    for t in turns:
        if t["source"] == "policy":
            out.append(seen)
            seen = []
        else:
            seen = seen + list(t["token_ids"] or [])
    return out


def anchor(observation: Sequence[int]) -> str:
    """The anchor state of a step: a hash of its observation's token ids."""
    data = np.asarray(observation, np.int64).tobytes()
    return hashlib.sha256(data).hexdigest()[:16]


def step_rewards(turns: Sequence[dict[str, Any]], reward: float) -> list[float]:
    """Per step, what it earned: the rewards of its turn and of the turns after it up to
    the next step (null: 0), with whatever of the row's ``reward`` (the episode's return)
    the turn rewards do not account for added to the last step. So the steps' rewards
    sum to ``reward`` less any reward of turns before the first step."""
    steps = policy_turns(turns)
    out = [0.0] * len(steps)
    if not steps:
        return out
    given = [float(t["reward"]) if t["reward"] is not None else 0.0 for t in turns]
    for j, k in enumerate(steps):
        end = steps[j + 1] if j + 1 < len(steps) else len(turns)
        out[j] = sum(given[k:end])
    out[-1] += float(reward) - sum(given)
    return out


def discounted(rewards: Sequence[float], gamma: float) -> list[float]:
    """``G_k = sum_{j >= k} gamma^(j - k) r_j`` for each step k."""
    out = [0.0] * len(rewards)
    running = 0.0
    for k in range(len(rewards) - 1, -1, -1):
        running = float(rewards[k]) + gamma * running
        out[k] = running
    return out
