"""Held-out evaluation: greedy decoding of the task's held-out prompts, scored by the task,
and optionally sampled decoding: mean reward and pass@k (:func:`pass_at_k`).

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
from gfcr.evaluation.columns import COMPLETION_SCHEMA
from gfcr.config.problems import tally
from gfcr.core.rollout import col
from gfcr.core.settings import Sampled
from gfcr.core.stage import Task

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


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k estimator of Chen et al. 2021 ("Evaluating Large Language
    Models Trained on Code", eq. 1): with ``c`` of ``n`` samples right, the chance that
    at least one of ``k`` drawn without replacement is right, ``1 - C(n-c, k) / C(n, k)``,
    computed as a product for numerical stability (their Figure 3)."""
    if not 1 <= k <= n or not 0 <= c <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n and 0 <= c <= n; got n={n!r}, c={c!r}, "
                         f"k={k!r}")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def evaluate(task: Task, engine: Engine, prompts: pa.Table, *, max_tokens: int,
             stop: tuple[str, ...] = (), progress: Progress | None = None,
             sampled: Sampled | None = None, seed: int = 0) -> dict[str, Any]:
    """Greedy accuracy on ``prompts`` and, with ``sampled``, mean reward and pass@k at its
    temperature (sampling seeded by ``seed``).

    Returns ``accuracy``, ``n`` (prompts), ``errors`` (the scorer's distinct errors, each
    once with its count: ``(message, count)``), ``mean_reward`` and ``pass_at`` (``{k:
    value}``; None and ``{}`` without ``sampled``) and ``completions``: one row per
    prompt and sample (``gfcr.evaluation.columns.COMPLETION_SCHEMA``; greedy rows have temperature 0, sample 0)."""
    rows = prompts.to_pylist()
    greedy = SamplingParams(temperature=0.0, max_tokens=max_tokens, stop=stop,
                            segment_tokens=max_tokens)
    n = 1 if sampled is None else 1 + sampled.samples
    hook = WaveCounter(len(rows) * n, progress) if progress is not None else None
    scored = _generate(task, engine, rows, greedy, 1, hook)
    out: dict[str, Any] = {"mean_reward": None, "pass_at": {}}
    if sampled is not None:
        params = SamplingParams(temperature=sampled.temperature, max_tokens=max_tokens,
                                stop=stop, segment_tokens=max_tokens, seed=seed)
        more = _generate(task, engine, rows, params, sampled.samples, hook)
        rewards = np.asarray([r["reward"] for r in more]).reshape(len(rows), sampled.samples)
        right = (rewards >= 1.0).sum(axis=1)
        out["mean_reward"] = float(rewards.mean()) if rows else 0.0
        out["pass_at"] = {k: float(np.mean([pass_at_k(sampled.samples, int(c), k)
                                            for c in right])) if rows else 0.0
                          for k in sampled.ks}
        scored += more
    if progress is not None:
        progress(len(rows) * n, len(rows) * n)
    first = [r["reward"] for r in scored[:len(rows)]]
    out.update(accuracy=float(np.mean(np.asarray(first) >= 1.0)) if rows else 0.0,
               n=float(len(rows)),
               errors=tally([r["error"] for r in scored if r["error"] is not None]),
               completions=pa.Table.from_pylist(scored, schema=COMPLETION_SCHEMA))
    return out


def _generate(task: Task, engine: Engine, rows: list[dict[str, Any]], params: SamplingParams,
              samples: int, hook: WaveCounter | None) -> list[dict[str, Any]]:
    """``samples`` completions of each row under ``params``, scored; COMPLETION_SCHEMA rows."""
    requests = [GenRequest(key=i * samples + j, prompt_ids=encode_prompt(engine, r[col.PROMPT]))
                for i, r in enumerate(rows) for j in range(samples)]
    outputs = engine.generate(requests, params, hook)
    found = []
    for req, out in zip(requests, outputs):
        row = rows[req.key // samples]
        text = engine.decode(out.completion_ids)
        reward, error = 0.0, None
        try:
            reward = float(task.score(text, row[col.ANSWER], row[col.META]))
        except Exception as err:  # a scorer error counts as wrong, never kills evaluation
            error = f"{type(err).__name__}: {err}"[:300]
        found.append({"prompt_id": row[col.PROMPT_ID], "sample": req.key % samples,
                      "temperature": params.temperature, "prompt": row[col.PROMPT],
                      "answer": row[col.ANSWER], "completion": text,
                      "n_tokens": len(out.completion_ids), "finish_reason": out.finish_reason,
                      "reward": reward, "correct": reward >= 1.0, "error": error})
    return found
