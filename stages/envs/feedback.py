"""The feedback task: answer, hear "wrong, try again" (or a hint), answer again.

A task row's prompt is asked; a reply whose last number is the reference answer ends
the episode with reward ``decay ** (tries - 1)``; a wrong one is told so, with the hint
the ``hint`` option asks for, and may try again, up to ``max_tries`` answers (then reward
0). With ``decay`` 1 every success counts the same, so what a policy can learn beyond
answering right the first time is to use the feedback: not to repeat a rejected answer,
or to follow the hint (Self-Refine's loop, Madaan et al. 2023, with the environment's
verdict as the feedback, as in the multi-turn RL of Kumar et al. 2024, "SCoRe").
"""

from __future__ import annotations

from typing import Any, Literal

from gfcr.core.environment import Message, Step, register_env
from stages.envs.answers import final_number, same_number

Hint = Literal["none", "direction", "answer"]


@register_env("feedback")
class Feedback:
    """Up to ``max_tries`` answers to a task's question, with feedback after each wrong one.

    ``hint``: ``none`` ("wrong, try again"), ``direction`` (the answer is higher/lower),
    ``answer`` (the reference answer itself: a task to learn to read the feedback).
    ``repeat``: the wrong-answer message ends with the question again.
    """

    def __init__(self, max_tries: int = 2, hint: Hint = "none", decay: float = 1.0,
                 message: str = "wrong, try again.", repeat: bool = False) -> None:
        if max_tries < 1:
            raise ValueError(f"feedback: max_tries must be >= 1, got {max_tries!r}")
        if hint not in ("none", "direction", "answer"):
            raise ValueError(f"feedback: hint must be none, direction or answer, got {hint!r}")
        self.max_tries, self.hint, self.decay = max_tries, hint, decay
        self.message, self.repeat = message, repeat
        self.tries = 0
        self.task: dict[str, Any] = {}

    def reset(self, task: dict[str, Any]) -> list[Message]:
        self.task, self.tries = task, 0
        return [Message("user", task["prompt"])]

    def step(self, reply: str) -> Step:
        self.tries += 1
        answer = self.task.get("answer")
        if same_number(reply, answer):
            return Step(reward=self.decay ** (self.tries - 1), done=True)
        if self.tries >= self.max_tries:
            return Step(reward=0.0, done=True)
        text = self._feedback(reply, answer)
        if self.repeat:
            text += " " + self.task["prompt"]
        return Step([Message("user", text)], reward=0.0)

    def _feedback(self, reply: str, answer: str | None) -> str:
        if self.hint == "answer":
            return f"{self.message} hint: {answer}."
        got = final_number(reply)
        if self.hint == "direction" and got is not None and answer is not None:
            higher = float(final_number(str(answer)) or 0) > float(got)
            return f"{self.message} it is {'higher' if higher else 'lower'}."
        return self.message
