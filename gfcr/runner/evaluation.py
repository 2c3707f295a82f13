"""Held-out evaluation: greedy decoding of the task's held-out prompts, scored by the task.

Accuracy is the share of prompts scored with full credit (1.0): a task scorer's partial
credit (e.g. reasoning-gym's 0.05 for a well-formed wrong answer) counts as wrong. A
scorer that raises counts as wrong too, and never stops the evaluation; its distinct
errors come back once each, with a count (``errors``), so the run can say so once.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pyarrow as pa

from gfcr.core.engine import Decision, Engine, GenRequest, Inflight, SamplingParams, encode_prompt
from gfcr.core.problems import tally
from gfcr.core.rollout import col

Progress = Callable[[int, int], None]
"""``progress(done, total)``: called as work advances (a progress bar, a log line)."""


class WaveCounter:
    """A :class:`gfcr.core.engine.SegmentHook` that decides nothing and counts finished
    prompts: engines announce each wave (``wave(keys)``), and every prompt of the waves
    before it is done."""

    def __init__(self, total: int, progress: Progress) -> None:
        self.total, self.progress = total, progress
        self.done, self.current = 0, 0

    def wave(self, keys: list[int]) -> None:
        self.done += self.current
        self.current = len(keys)
        self.progress(self.done, self.total)

    def __call__(self, inflight: list[Inflight]) -> dict[int, Decision]:
        return {}

    def expect(self, groups: dict[int, str]) -> None:
        """Groups do not matter to a counter."""


def evaluate(task: Any, engine: Engine, prompts: pa.Table, *, max_tokens: int,
             stop: tuple[str, ...] = (), progress: Progress | None = None) -> dict[str, Any]:
    """Greedy accuracy on held-out prompts: ``accuracy``, ``n`` (prompts), ``errors``
    (the scorer's distinct errors, each once with its count: ``(message, count)``)."""
    rows = prompts.to_pylist()
    requests = [GenRequest(key=i, prompt_ids=encode_prompt(engine, r[col.PROMPT]))
                for i, r in enumerate(rows)]
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, stop=stop,
                            segment_tokens=max_tokens)
    hook = WaveCounter(len(rows), progress) if progress is not None else None
    outputs = engine.generate(requests, params, hook)
    if progress is not None:
        progress(len(rows), len(rows))
    scores, errors = [], []
    for row, out in zip(rows, outputs):
        try:
            scores.append(float(task.score(engine.decode(out.completion_ids),
                                           row[col.ANSWER], row[col.META])))
        except Exception as err:  # a scorer error counts as wrong, never kills evaluation
            scores.append(0.0)
            errors.append(f"{type(err).__name__}: {err}"[:300])
    return {"accuracy": float(np.mean(np.asarray(scores) >= 1.0)) if scores else 0.0,
            "n": float(len(scores)), "errors": tally(errors)}
