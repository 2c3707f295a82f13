"""A long-tailed response-length workload for the Control benchmark, from a real model.

The task: ``"c*k="`` asks for the character ``c`` written ``k`` times. ``k`` follows a
truncated power law (``P(k) ∝ k^-1.1`` on 1..48), so most answers are a few characters
and a few are dozens. A tiny Llama (real transformers classes, character tokenizer) is
warm-started here by the project's supervised stage on the reference answers, briefly
enough that it counts short answers right and long ones roughly; its sampled response
lengths then have the long tail of the task plus that of its own counting noise and
occasional failures to stop: the setting of APRIL's "a few lengthy responses stall
entire batches". No sleeps and no scripted engine: lengths are what the model samples.
The reward is exact match.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import pyarrow as pa
from pydantic import Field

from gfcr.core.rollout import PROMPT_SCHEMA, prompt_id
from gfcr.core.stage import Spec
from gfcr.core.registry import register
from stages import SFT, TinyLlama

CHARS = "abcdefgh"
MAX_K = 48
MAX_TOKENS = 64
"""Generation cap: the longest answer plus room for a model that does not stop."""


def _prompts(n: int, seed: int) -> list[tuple[str, str]]:
    rng = np.random.default_rng(seed)
    ks = np.arange(1, MAX_K + 1)
    p = ks ** -1.1
    p /= p.sum()
    out = []
    for _ in range(n):
        c, k = CHARS[int(rng.integers(len(CHARS)))], int(rng.choice(ks, p=p))
        out.append((f"{c}*{k}=", c * k))
    return out


@register("task")
class Repeat(Spec):
    """``c*k=`` -> ``c`` repeated ``k`` times, ``k`` long-tailed; exact match scores 1."""

    type: Literal["_bench_repeat"] = "_bench_repeat"
    train_size: int = Field(2000, ge=1)
    heldout_size: int = Field(128, ge=1)

    def _table(self, rows: list[tuple[str, str]]) -> pa.Table:
        return pa.Table.from_pylist(
            [{"prompt_id": prompt_id("repeat", q), "task": "repeat", "prompt": q,
              "answer": a, "meta": None} for q, a in rows], schema=PROMPT_SCHEMA)

    def train_prompts(self) -> pa.Table:
        return self._table(_prompts(self.train_size, 0))

    def heldout_prompts(self) -> pa.Table:
        return self._table(_prompts(self.heldout_size, 1))

    def score(self, completion: str, answer: str | None, meta: str | None) -> float:
        return float(completion == answer)


POLICY = TinyLlama(hidden_size=64, num_layers=2, num_heads=4, intermediate_size=128,
                   max_position=128)
"""About 0.1M parameters: warm-started in seconds on 2 cores."""
WARMSTART = SFT(steps=120, batch_size=32, lr=3e-3)
"""Short on purpose: short answers come out right, long ones mostly wrong (learnable)."""
