"""A verifiers (v1) environment's tasks as gfcr's task: training and held-out prompts.

A v1 taskset has one stream of tasks (no separate eval dataset in 0.4.0), so the held-out
split is drawn under ``seed``: the environment's tasks shuffled and the first
``heldout_fraction`` of them held out (every task in one split only). Each row's ``meta``
holds ``{"vf_idx": i}``, the task's index in the environment, which
:class:`stages.generate.verifiers_env.VerifiersEnv` uses to run that very task. Its
``prompt`` is the task's prompt text.

Training rewards are the rubric's over whole episodes (``VerifiersEnv`` runs them);
:meth:`score`, which a held-out evaluation of single greedy completions calls, is the
rubric on the one-turn conversation of the task's prompt and the completion (exact for a
single-turn environment; for a multi-turn one, its first turn alone).

>>> VerifiersTask(module="my_env", heldout_fraction=0.2)  # doctest: +SKIP
"""

from __future__ import annotations

import json
from typing import Any, Literal

import numpy as np
import pyarrow as pa
from pydantic import Field, PrivateAttr, model_validator

from gfcr.core.rollout import PROMPT_SCHEMA, prompt_id
from gfcr.core.stage import Spec
from gfcr.core.registry import register
from stages.envs import _vf


@register("task")
class VerifiersTask(Spec):
    """The tasks of a verifiers environment (module docstring)."""

    type: Literal["verifiers"] = "verifiers"
    module: str
    """The environment, as ``VerifiersEnv.module``."""
    args: dict[str, Any] = Field(default_factory=dict)
    """Its arguments, as ``VerifiersEnv.args``."""
    heldout_fraction: float = Field(0.2, gt=0.0, lt=1.0)
    """The share of the environment's tasks held out (at least one, never all)."""
    seed: int = Field(0, ge=0)
    """Seeds the shuffle that draws the held-out tasks."""

    _splits: tuple[pa.Table, pa.Table] | None = PrivateAttr(default=None)
    _tasks: dict[int, Any] = PrivateAttr(default_factory=dict)

    @model_validator(mode="after")
    def _reads(self) -> "VerifiersTask":
        env = _vf.load(self.module, self.args, 1)
        self._tasks = {t.data.idx: t for t in _vf.tasks(env)}
        rows = [{"prompt_id": prompt_id(self.module, t.data.prompt_text),
                 "task": self.module, "prompt": t.data.prompt_text,
                 "answer": _answer(t.data), "meta": json.dumps({"vf_idx": t.data.idx})}
                for t in self._tasks.values()]
        if len(rows) < 2:
            raise ValueError(f"verifiers environment {self.module!r} has {len(rows)} "
                             "task(s); a train and a held-out split need 2 or more")
        order = np.random.default_rng(self.seed).permutation(len(rows))
        cut = min(len(rows) - 1, max(1, round(self.heldout_fraction * len(rows))))
        held = [rows[i] for i in sorted(order[:cut])]
        train = [rows[i] for i in sorted(order[cut:])]
        self._splits = (pa.Table.from_pylist(train, schema=PROMPT_SCHEMA),
                        pa.Table.from_pylist(held, schema=PROMPT_SCHEMA))
        return self

    def prompt_counts(self) -> dict[str, int]:
        train, held = self._tables()
        return {"train": train.num_rows, "heldout": held.num_rows}

    def train_prompts(self) -> pa.Table:
        return self._tables()[0]

    def heldout_prompts(self) -> pa.Table:
        return self._tables()[1]

    def score(self, completion: str, answer: str | None, meta: str | None) -> float:
        idx = json.loads(meta or "{}").get("vf_idx")
        if idx not in self._tasks:
            raise ValueError(f"verifiers environment {self.module!r}: meta {meta!r} names "
                             "none of its tasks")
        return _vf.score_reply(self._tasks[idx], completion)

    def _tables(self) -> tuple[pa.Table, pa.Table]:
        assert self._splits is not None
        return self._splits


def _answer(data: Any) -> str | None:
    value = getattr(data, "answer", None)
    return None if value is None else value if isinstance(value, str) else json.dumps(value)
