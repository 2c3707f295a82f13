"""Verification: score every complete rollout with a verifier (RLVR).

A verifier that raises or runs past ``timeout`` never kills the run by itself: the error
is recorded in ``score_error`` on that rollout, and the rollout is dropped
(``on_error="drop"``) or scored 0 (``"zero"``). A broken scorer is stopped, though:

- a step's scoring has a time ``budget``; what is left unscored when it is spent is
  marked ``not scored`` (no call is waited for past the budget);
- a circuit ``breaker``: after that many consecutive failed calls (errors, timeouts),
  the step stops calling the scorer, with a warning naming the last error;
- a step on which the scorer failed on *every* rollout ends the run with
  :class:`ScorerFailed` (exit code 1 from ``gfcr run``): training on nothing but errors
  is never what was meant, and the steps already committed stay stored, so ``--resume``
  goes on once the scorer is fixed. A program that crashed or that the sandbox stopped
  is a verdict on the program (:class:`~stages.filter.verifiers.Wrong`: reward 0, the
  reason in ``score_error``, the rollout kept whatever ``on_error`` says), not a scorer
  failure, and counts for neither rule.

Where a scorer runs (``worker``): a scorer that may run long (math, code, a user's
``module:function``) is called in a worker process (:mod:`gfcr.procs.scorer_workers`). A call
past ``timeout`` has its worker killed and the next call gets a fresh one, so a completion
that hangs the scorer costs one timeout and the other rollouts are still scored; a worker
that dies (``os._exit``, a segfault, a signal) is that rollout's scorer failure, and
nothing a scorer does can freeze or end the run. ``worker=False`` calls the scorer in the
trainer's process instead (the default for the task's scorer and for match): faster, and
sharing the run's state, but a call past ``timeout`` cannot be stopped; it holds its
helper thread until it returns (:mod:`gfcr.procs.helper`), and the calls after it fail at once,
so a hanging scorer costs one timeout a step and one thread.

Every row Verify scores gets :data:`SCORE_ISOLATION`. Verifiers are in
:mod:`stages.filter.verifiers`; model-written code only ever runs in the sandbox.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Iterable, Literal

import pyarrow as pa
from pydantic import Field, field_validator, model_validator

from gfcr.core.rollout import col
from gfcr.core.stage import FilterResult, StageSpec, StepContext
from gfcr.core.registry import register
from gfcr.procs import scorer_workers
from gfcr.procs.helper import call_with_timeout, charge
from stages.filter._table import set_column
from stages.filter.verifiers import (CodeTests, Function, MathAnswer, SandboxViolation, Scorer,
                                     Verifier, VerifierSpec, Wrong, from_shorthand)

SCORE_ISOLATION = "score_isolation"
"""Extra column (string) Verify writes on every row it scores: how the verifier ran the
model's output. ``namespaces``: :class:`CodeTests` in the bubblewrap sandbox; ``unsafe``:
CodeTests opted out of it (``Sandbox(isolation="unsafe")``); ``worker``: a scorer that
reads the completion as text in a scorer worker process (math, a user function);
``in_process``: one that reads it in the trainer's process (task, match, or any scorer
with ``worker=False``). A row scored by several Verify stages keeps the weakest: unsafe,
then namespaces, then in_process, then worker."""

_WEAKEST = ("unsafe", "namespaces", "in_process", "worker")
_IN_WORKER = (MathAnswer, CodeTests, Function)
"""The verifiers called in a worker process unless ``worker=False``."""


Call = Callable[[str, Any, Any, float, float], tuple[float, "str | None", bool]]
"""``(completion, answer, meta, timeout, ready) -> (reward, error, failed)``: one scorer
call under its timeout and at most ``ready`` seconds in all (the step's budget left, a
worker's start included); ``failed`` when the scorer failed (not when the sandbox stopped
the program)."""


class ScorerFailed(RuntimeError):
    """The scorer failed on every rollout of a step: the run stops."""


@register("filter")
class Verify(StageSpec):
    """Write ``reward`` and ``rewards[<name>]`` from a verifier.

    ``scorer`` is a verifier config (``MathAnswer()``, ``Match(pattern=...)``,
    ``CodeTests(sandbox=...)``, ...) or a shorthand: ``"task"`` (the task's own scorer,
    e.g. reasoning-gym's ``score_answer``), ``"math"``, ``"exact"``, ``"code"``,
    ``"regex:<pattern>"`` or ``"module:function"`` naming ``(completion, answer, meta) ->
    float``. ``timeout`` bounds each call in seconds; a call past it is recorded as a
    ``TimeoutError`` (its worker process killed; an in-process call is left to finish on
    its helper thread, since it cannot be killed). ``budget`` bounds a step's scoring in
    seconds, ``breaker`` the consecutive failed calls, ``worker`` where the scorer runs
    (see the module).

    >>> Verify()  # doctest: +NORMALIZE_WHITESPACE
    Verify(name=None, type='verify', scorer='task', on_error='drop', timeout=10.0,
           budget=600.0, breaker=8, worker=None, full_credit_only=False)
    """

    type: Literal["verify"] = "verify"
    scorer: str | VerifierSpec = "task"
    """The verifier: a config (``MathAnswer()``, ...) or a shorthand string (see above)."""
    on_error: Literal["drop", "zero"] = "drop"
    """A rollout whose scorer raised or timed out: ``drop`` it, or keep it with reward 0."""
    timeout: float = Field(10.0, gt=0.0)
    """Seconds one scorer call may take; a call past it is recorded as a TimeoutError."""
    budget: float = Field(default=600.0, gt=0.0)
    """Seconds a step's scoring may take in all (see the module)."""
    breaker: int = Field(default=8, ge=1)
    """Consecutive failed scorer calls after which scoring stops (see the module)."""
    worker: bool | None = None
    """Call the scorer in a worker process killed at each call's deadline (True), or in
    the trainer's process (False); None: in a worker for math, code and ``module:function``
    scorers, in-process for the task's scorer and match."""
    full_credit_only: bool = False
    """Reward 1 for full credit and 0 for anything less. Task scorers give partial credit
    (reasoning-gym: e.g. 0.05 for a well-formed wrong grid, a share of the items of a list
    answer; see ``ReasoningGym.score``); with this set, only a right answer is rewarded."""

    reads: ClassVar[frozenset[str]] = frozenset({col.COMPLETION, col.ANSWER, col.META})
    writes: ClassVar[frozenset[str]] = frozenset({col.REWARD, col.REWARDS, col.SCORE_ERROR,
                                                  SCORE_ISOLATION})

    @field_validator("scorer")
    @classmethod
    def _scorer_ref(cls, value: Any) -> Any:
        if isinstance(value, str):
            from_shorthand(value)  # raises ValueError naming the accepted forms
        return value

    @model_validator(mode="after")
    def _timeout_covers_sandbox(self) -> "Verify":
        verifier = self.verifier()
        if isinstance(verifier, CodeTests) and self.timeout <= verifier.sandbox.wall_seconds:
            raise ValueError(f"timeout={self.timeout!r} must exceed the code verifier's "
                             f"sandbox.wall_seconds={verifier.sandbox.wall_seconds!r}")
        return self

    def verifier(self) -> Verifier:
        return from_shorthand(self.scorer) if isinstance(self.scorer, str) else self.scorer

    def resolve(self, ctx: StepContext) -> Scorer:
        try:
            return self.verifier().scorer(ctx)
        except ValueError as err:
            raise ValueError(f"stage {self.label!r}: {err}") from None

    def in_worker(self) -> bool:
        """Whether the scorer is called in a worker process (see ``worker``)."""
        return isinstance(self.verifier(), _IN_WORKER) if self.worker is None else self.worker

    def isolation(self) -> str:
        """The :data:`SCORE_ISOLATION` of the rows this stage scores."""
        verifier = self.verifier()
        if isinstance(verifier, CodeTests):
            return verifier.sandbox.isolation
        return "worker" if self.in_worker() else "in_process"

    def caller(self, ctx: StepContext) -> "Call":
        """How this step calls its scorer: in a worker process or on a helper thread."""
        score = self.resolve(ctx)
        if not self.in_worker():
            return lambda completion, answer, meta, timeout, ready: _safe(
                score, completion, answer, meta, timeout)
        try:
            sent = scorer_workers.payload(score)
        except ValueError as err:
            raise ValueError(f"stage {self.label!r}: {err}; or call it in the trainer's "
                             f"process with Verify(worker=False)") from None
        return lambda completion, answer, meta, timeout, ready: _in_worker(
            sent, (completion, answer, meta), timeout, ready)

    def apply(self, ctx: StepContext, rollouts: pa.Table) -> FilterResult:
        call = self.caller(ctx)
        rows = zip(*(rollouts.column(n).to_pylist()
                     for n in (col.COMPLETION, col.ANSWER, col.META)))
        scoring = _Scoring(self.timeout, self.budget, self.breaker)
        rewards, errors = scoring.run(call, rows)
        verdicts = scoring.verdicts
        if self.full_credit_only:
            rewards = [1.0 if r >= 1.0 else 0.0 for r in rewards]
        where = f"stage {self.label!r}, step {ctx.step}"
        if scoring.stopped is not None:
            warnings.warn(f"{where}: scoring stopped: {scoring.stopped}", RuntimeWarning,
                          stacklevel=2)
        if rollouts.num_rows and scoring.failures == rollouts.num_rows:
            raise ScorerFailed(
                f"{where}: the scorer failed on all {rollouts.num_rows} rollouts "
                f"(first error: {next(e for e in errors if e)}); the run stops, since "
                f"training on nothing but scorer errors is never meant. The steps already "
                f"committed stay stored: fix the scorer, then resume the run (gfcr run "
                f"--resume {ctx.run_id}).")
        table = _with(rollouts, rewards, errors, self.label)
        table = _with_isolation(table, self.isolation())
        keep = [e is None or v or self.on_error == "zero" for e, v in zip(errors, verdicts)]
        reasons = [None if e is None else "score_error" for e in errors]
        return FilterResult(table, keep=keep, reason=reasons)


@dataclass
class _Scoring:
    """One step's scoring: calls under the per-call timeout and the step's deadline,
    with the circuit breaker; ``failures`` counts the rows whose scorer failed."""

    timeout: float
    budget: float
    breaker: int
    failures: int = 0
    stopped: str | None = None
    verdicts: list[bool] = field(default_factory=list)
    """Per row: its error is a verdict on the program (:class:`Wrong`), not a failure."""
    _streak: int = field(default=0, repr=False)

    def run(self, call: "Call", rows: Iterable[tuple[Any, Any, Any]]
            ) -> tuple[list[float], list[str | None]]:
        rewards: list[float] = []
        errors: list[str | None] = []
        deadline = time.monotonic() + self.budget
        for completion, answer, meta in rows:
            left = deadline - time.monotonic()
            if self.stopped is None and left <= 0:
                self.stopped = f"its time budget of {self.budget:g}s is spent"
            error: str | None
            if self.stopped is not None:
                value, error, failed = 0.0, f"not scored: {self.stopped}", True
            else:
                value, error, failed = call(completion, answer, meta,
                                            min(self.timeout, left), left)
            self._streak = self._streak + 1 if failed else 0
            self.failures += failed
            if self.stopped is None and self._streak >= self.breaker:
                self.stopped = (f"the scorer failed {self._streak} times in a row "
                                f"(circuit breaker; last error: {error})")
            rewards.append(value)
            errors.append(error)
            self.verdicts.append(error is not None and not failed)
        return rewards, errors


def _safe(score: Scorer, completion: str, answer: Any, meta: Any,
          timeout: float) -> tuple[float, str | None, bool]:
    """``(reward, error, failed)`` of one call: ``failed`` when the scorer failed (an
    error, a timeout, a non-finite value), not when the sandbox stopped the program."""
    box: dict[str, Any] = {}

    def call() -> None:
        try:
            box["value"] = float(score(completion, answer, meta))
        except BaseException as err:  # noqa: BLE001 - a user's scorer may raise anything
            box["error"] = f"{type(err).__name__}: {err}"[:500]
            box["violation"] = isinstance(err, Wrong)

    outcome = call_with_timeout(call, timeout)
    if outcome == "timeout":
        return 0.0, f"TimeoutError: scorer ran past its limit of {timeout:.3g}s", True
    if outcome == "busy":
        return 0.0, "TimeoutError: an earlier call of the scorer is still running", True
    if "error" in box:
        return 0.0, box["error"], not box["violation"]
    return _finite(box["value"])


_VERDICTS = frozenset(f"{kind.__module__}.{kind.__qualname__}"
                      for kind in (Wrong, SandboxViolation))
"""The qualified names of the errors that are verdicts on the program, as a worker
reports them (the exception's class does not cross the process boundary)."""


def _in_worker(sent: scorer_workers.Payload, args: tuple[Any, Any, Any], timeout: float,
               ready: float) -> tuple[float, str | None, bool]:
    """:func:`_safe` for a scorer in a worker process: at most ``timeout`` seconds for
    the call, and ``ready`` in all (starting a worker and loading the scorer there)."""
    reply = scorer_workers.pool().call(sent, args, timeout=timeout, ready=ready)
    charge(reply.cpu)
    if reply.error is not None:
        return 0.0, reply.error, reply.error_type not in _VERDICTS
    return _finite(reply.value if reply.value is not None else float("nan"))


def _finite(value: float) -> tuple[float, str | None, bool]:
    if value != value or value in (float("inf"), float("-inf")):
        return 0.0, f"scorer returned {value!r}", True
    return value, None, False


def _with_isolation(table: pa.Table, isolation: str) -> pa.Table:
    """``table`` with :data:`SCORE_ISOLATION` set to ``isolation``, or kept where an
    earlier Verify stage recorded a weaker one."""
    before = (table.column(SCORE_ISOLATION).to_pylist() if SCORE_ISOLATION in table.column_names
              else [None] * table.num_rows)
    values = [isolation if b is None else min(b, isolation, key=_WEAKEST.index) for b in before]
    return set_column(table, SCORE_ISOLATION, pa.array(values, pa.string()))

def _with(table: pa.Table, rewards: list[float], errors: list[str | None],
          label: str) -> pa.Table:
    def put(t: pa.Table, name: str, values: Any) -> pa.Table:
        i = t.schema.get_field_index(name)
        return t.set_column(i, t.schema.field(i), pa.array(values, t.schema.field(i).type))
    table = put(table, col.REWARD, rewards)
    table = put(table, col.REWARDS, [[(label, r)] for r in rewards])
    return put(table, col.SCORE_ERROR, errors)
