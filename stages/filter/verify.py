"""Verification: score every complete rollout with a verifier (RLVR).

A verifier that raises or runs past ``timeout`` never kills the run: the error is
recorded in ``score_error`` on that rollout, and the rollout is dropped
(``on_error="drop"``) or scored 0 (``"zero"``). Verifiers are in
:mod:`stages.filter.verifiers`; model-written code only ever runs in the sandbox.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import pyarrow as pa
from pydantic import Field, field_validator, model_validator

from gfcr.helper import call_with_timeout
from gfcr.rollout import col
from gfcr.stage import FilterResult, StageSpec, StepContext, register
from stages.filter.verifiers import CodeTests, Scorer, Verifier, VerifierSpec, from_shorthand


@register("filter")
class Verify(StageSpec):
    """Write ``reward`` and ``rewards[<name>]`` from a verifier.

    ``scorer`` is a verifier config (``MathAnswer()``, ``Match(pattern=...)``,
    ``CodeTests(limits=...)``, ...) or a shorthand: ``"task"`` (the task's own scorer,
    e.g. reasoning-gym's ``score_answer``), ``"math"``, ``"exact"``, ``"code"``,
    ``"regex:<pattern>"`` or ``"module:function"`` naming ``(completion, answer, meta) ->
    float``. ``timeout`` bounds each call in seconds; a call past it is recorded as a
    ``TimeoutError`` and left to finish on its helper thread (:mod:`gfcr.helper`; an
    in-process call cannot be killed; code verifiers run in the sandbox, which can).

    >>> Verify()
    Verify(name=None, type='verify', scorer='task', on_error='drop', timeout=10.0)
    """

    type: Literal["verify"] = "verify"
    scorer: str | VerifierSpec = "task"
    on_error: Literal["drop", "zero"] = "drop"
    timeout: float = Field(10.0, gt=0.0)

    reads: ClassVar[frozenset[str]] = frozenset({col.COMPLETION, col.ANSWER, col.META})
    writes: ClassVar[frozenset[str]] = frozenset({col.REWARD, col.REWARDS, col.SCORE_ERROR})

    @field_validator("scorer")
    @classmethod
    def _scorer_ref(cls, value: Any) -> Any:
        if isinstance(value, str):
            from_shorthand(value)  # raises ValueError naming the accepted forms
        return value

    @model_validator(mode="after")
    def _timeout_covers_sandbox(self) -> "Verify":
        verifier = self.verifier()
        if isinstance(verifier, CodeTests) and self.timeout <= verifier.limits.wall_seconds:
            raise ValueError(f"timeout={self.timeout!r} must exceed the sandbox's "
                             f"limits.wall_seconds={verifier.limits.wall_seconds!r}")
        return self

    def verifier(self) -> Verifier:
        return from_shorthand(self.scorer) if isinstance(self.scorer, str) else self.scorer

    def resolve(self, ctx: StepContext) -> Scorer:
        try:
            return self.verifier().scorer(ctx)
        except ValueError as err:
            raise ValueError(f"stage {self.label!r}: {err}") from None

    def apply(self, ctx: StepContext, rollouts: pa.Table) -> FilterResult:
        score = self.resolve(ctx)
        rewards, errors = [], []
        for c, a, m in zip(*(rollouts.column(n).to_pylist()
                             for n in (col.COMPLETION, col.ANSWER, col.META))):
            value, error = _safe(score, c, a, m, self.timeout)
            rewards.append(value)
            errors.append(error)
        table = _with(rollouts, rewards, errors, self.label)
        keep = [e is None or self.on_error == "zero" for e in errors]
        reasons = [None if e is None else "score_error" for e in errors]
        return FilterResult(table, keep=keep, reason=reasons)


def _safe(score: Scorer, completion: str, answer: Any, meta: Any,
          timeout: float) -> tuple[float, str | None]:
    box: dict[str, Any] = {}

    def call() -> None:
        try:
            box["value"] = float(score(completion, answer, meta))
        except BaseException as err:  # noqa: BLE001 - a user's scorer may raise anything
            box["error"] = f"{type(err).__name__}: {err}"[:500]

    if not call_with_timeout(call, timeout):
        return 0.0, f"TimeoutError: scorer ran past timeout={timeout!r}s"
    if "error" in box:
        return 0.0, box["error"]
    value = box["value"]
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
