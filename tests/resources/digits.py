"""A trivially learnable task for learning tests: answer anything with digits only.

The reward is the share of the first four completion characters that are digits, so a
random policy already earns some (about 10% per character) and GRPO has signal from the
first step; held-out prompts are different strings from the training prompts.
"""

from __future__ import annotations

from typing import Literal

import pyarrow as pa

from gfcr import Spec, prompt_id, register
from gfcr.core.rollout import PROMPT_SCHEMA

WORDS = ["apple", "river", "cloud", "stone", "green", "light", "music", "table", "water",
         "smile", "bread", "chair", "dream", "field", "glass", "heart"]


def _table(prompts: list[str]) -> pa.Table:
    return pa.Table.from_pylist(
        [{"prompt_id": prompt_id("digits", p), "task": "digits", "prompt": p,
          "answer": None, "meta": None} for p in prompts], schema=PROMPT_SCHEMA)


@register("task")
class Digits(Spec):
    type: Literal["_digits"] = "_digits"

    def train_prompts(self) -> pa.Table:
        return _table([f"{w}:" for w in WORDS[:12]])

    def heldout_prompts(self) -> pa.Table:
        return _table([f"{w}?" for w in WORDS[12:]] + [f"{w}!" for w in WORDS[:4]])

    def score(self, completion: str, answer: str | None, meta: str | None) -> float:
        head = completion[:4]
        return sum(c.isdigit() for c in head) / 4


def explode(completion: str, answer: str | None, meta: str | None) -> float:
    """A user's reward function with a bug on some inputs."""
    if "a" in completion:
        raise RuntimeError("reward function bug")
    return 1.0 if completion[:1].isdigit() else 0.0


@register("task")
class DigitAnswers(Digits):
    """:class:`Digits` with an answer per prompt (four digits spelled from its word), so a
    supervised warm start has something to imitate; scored as Digits (any digits count)."""

    type: Literal["_digit_answers"] = "_digit_answers"  # type: ignore[assignment]

    def train_prompts(self) -> pa.Table:
        table = super().train_prompts()
        answers = [_spelled(p) for p in table.column("prompt").to_pylist()]
        return table.set_column(table.schema.get_field_index("answer"), "answer",
                                pa.array(answers, pa.string()))


def _spelled(prompt: str) -> str:
    return "".join(str(ord(c) % 10) for c in prompt[:4])
