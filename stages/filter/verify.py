"""Verification: score every complete rollout with the task's own scorer or a user function.

A scorer that raises never kills the run: the error is recorded in ``score_error`` on
that rollout, and the rollout is dropped (``on_error="drop"``) or scored 0 (``"zero"``).
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, ClassVar, Literal

import pyarrow as pa
from pydantic import field_validator

from gfcr.rollout import col
from gfcr.stage import FilterResult, StageSpec, StepContext, register

Scorer = Callable[[str, Any, Any], float]


@register("filter")
class Verify(StageSpec):
    """Write ``reward`` and ``rewards[<name>]`` from a verifier (RLVR).

    ``scorer`` is ``"task"`` (the task's own scorer, e.g. reasoning-gym's
    ``score_answer``) or ``"module:function"`` naming a function
    ``(completion, answer, meta) -> float``.

    >>> Verify()
    Verify(name=None, type='verify', scorer='task', on_error='drop')
    """

    type: Literal["verify"] = "verify"
    scorer: str = "task"
    on_error: Literal["drop", "zero"] = "drop"

    reads: ClassVar[frozenset[str]] = frozenset({col.COMPLETION, col.ANSWER, col.META})
    writes: ClassVar[frozenset[str]] = frozenset({col.REWARD, col.REWARDS, col.SCORE_ERROR})

    @field_validator("scorer")
    @classmethod
    def _scorer_ref(cls, value: str) -> str:
        if value != "task" and value.count(":") != 1:
            raise ValueError(f"scorer must be 'task' or 'module:function', got {value!r}")
        return value

    def resolve(self, ctx: StepContext) -> Scorer:
        if self.scorer == "task":
            return ctx.task.score
        module, _, name = self.scorer.partition(":")
        try:
            return getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as err:
            raise ValueError(f"stage {self.label!r}: cannot import scorer "
                             f"{self.scorer!r}: {err}") from None

    def apply(self, ctx: StepContext, rollouts: pa.Table) -> FilterResult:
        score = self.resolve(ctx)
        rewards, errors = [], []
        for c, a, m in zip(*(rollouts.column(n).to_pylist()
                             for n in (col.COMPLETION, col.ANSWER, col.META))):
            value, error = _safe(score, c, a, m)
            rewards.append(value)
            errors.append(error)
        table = _with(rollouts, rewards, errors, self.label)
        keep = [e is None or self.on_error == "zero" for e in errors]
        reasons = [None if e is None else "score_error" for e in errors]
        return FilterResult(table, keep=keep, reason=reasons)


def _safe(score: Scorer, completion: str, answer: Any, meta: Any) -> tuple[float, str | None]:
    try:
        value = float(score(completion, answer, meta))
    except Exception as err:  # noqa: BLE001 - a user's scorer may raise anything
        return 0.0, f"{type(err).__name__}: {err}"[:500]
    if value != value or value in (float("inf"), float("-inf")):
        return 0.0, f"scorer returned {value!r}"
    return value, None


def _with(table: pa.Table, rewards: list[float], errors: list[str | None],
          label: str) -> pa.Table:
    def put(t: pa.Table, name: str, values: Any) -> pa.Table:
        i = t.schema.get_field_index(name)
        return t.set_column(i, t.schema.field(i), pa.array(values, t.schema.field(i).type))
    table = put(table, col.REWARD, rewards)
    table = put(table, col.REWARDS, [[(label, r)] for r in rewards])
    return put(table, col.SCORE_ERROR, errors)
