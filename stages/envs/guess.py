"""A number-guessing game: the environment's state (the range still possible) changes
with every guess, and each answer depends on it.

The secret is the task's answer when that is an integer in ``[low, high]``, else drawn
from the task's prompt id (the same task always hides the same number). A guess hears
"higher" or "lower"; a reply without a number hears the rules again (reward
``format_reward``); the right guess ends the episode with reward 1 (the stage's
``max_turns`` bounds the guesses). Binary search finds it in ``ceil(log2(high-low+1))``
guesses: a multi-step task whose optimal policy must use every observation.
"""

from __future__ import annotations

import hashlib
from typing import Any

from gfcr.core.environment import Message, Step, register_env
from stages.envs.answers import final_number


@register_env("guess")
class GuessNumber:
    """Guess a hidden integer in ``[low, high]`` from higher/lower answers."""

    def __init__(self, low: int = 1, high: int = 16, format_reward: float = 0.0) -> None:
        if low > high:
            raise ValueError(f"guess: low={low!r} is above high={high!r}")
        self.low, self.high, self.format_reward = low, high, format_reward
        self.secret = low
        self.guesses: list[int] = []

    def reset(self, task: dict[str, Any]) -> list[Message]:
        self.secret, self.guesses = self._secret(task), []
        return [Message("user", f"Guess my number from {self.low} to {self.high}. "
                                f"Reply with one number.")]

    def _secret(self, task: dict[str, Any]) -> int:
        answer = final_number(str(task.get("answer") or ""))
        if answer is not None and float(answer).is_integer() and \
                self.low <= int(float(answer)) <= self.high:
            return int(float(answer))
        seed = hashlib.sha256(str(task.get("prompt_id") or task["prompt"]).encode()).digest()
        return self.low + int.from_bytes(seed[:4], "big") % (self.high - self.low + 1)

    def step(self, reply: str) -> Step:
        got = final_number(reply)
        if got is None or not float(got).is_integer():
            return Step([Message("user", f"Reply with one number from {self.low} to "
                                         f"{self.high}.")], reward=self.format_reward)
        guess = int(float(got))
        self.guesses.append(guess)
        if guess == self.secret:
            return Step(reward=1.0, done=True)
        return Step([Message("user", "higher" if self.secret > guess else "lower")],
                    reward=0.0)
