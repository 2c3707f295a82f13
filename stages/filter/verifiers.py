"""Verifiers: one protocol, several implementations, all used through :class:`Verify`.

A verifier turns a completion into a reward. Its protocol is one method,
``scorer(ctx) -> (completion, answer, meta) -> float``; the callable may raise (the
Verify stage records the error in ``score_error`` and the run goes on). Implementations:

- :class:`TaskScore` — the task's own scorer (reasoning-gym's ``score_answer``;
  Stojanovski et al. 2025, "REASONING GYM").
- :class:`MathAnswer` — math-verify (Hugging Face): the parsed completion is
  mathematically equivalent to the parsed reference answer.
- :class:`Match` — exact match of the stripped completion, or of the first group of a
  regular expression, against the reference answer.
- :class:`CodeTests` — runs model-written code against the rollout's tests in
  :mod:`stages.sandbox` (the model's code never runs in this process) and takes
  the verdict outside it (:mod:`stages.sandbox.harness`).
- :class:`Function` — any ``module:function`` taking ``(completion, answer, meta)``.
- :class:`stages.filter.list_order.ListOrder` — partial credit for a list answer in an
  almost-right order.

Verify also accepts a string shorthand: ``"task"``, ``"math"``, ``"exact"``, ``"code"``,
``"regex:<pattern>"`` or ``"module:function"``.
"""

from __future__ import annotations

import json
import re
import warnings
from dataclasses import dataclass
from typing import Annotated, Any, Callable, Literal, Protocol, Union

from pydantic import Field, field_validator

from gfcr.config.refs import resolve
from gfcr.core.stage import Spec, StepContext
from stages.filter.list_order import ListOrder
from stages.sandbox.harness import passed, plan
from stages.sandbox import Sandbox, refusal, run_python, unavailable

Scorer = Callable[[str, Any, Any], float]
"""``(completion, answer, meta) -> reward``; may raise."""


class Verifier(Protocol):
    """What Verify needs of a verifier: a scorer bound to the step's context."""

    def scorer(self, ctx: StepContext) -> Scorer: ...


class Wrong(RuntimeError):
    """A verdict, not a scorer failure: the program is wrong (reward 0) for the reason
    given; it crashed, hit a limit, or cannot be run at all (too large, not text).
    Verify records the reason in ``score_error`` and keeps the rollout, so a policy
    cannot turn a wrong answer into one that is not counted."""


class SandboxViolation(Wrong):
    """The sandbox stopped the program (time, memory, processes, network, files)."""


class TaskScore(Spec):
    """The task component's own scorer."""

    type: Literal["task"] = "task"

    def scorer(self, ctx: StepContext) -> Scorer:
        return ctx.task.score


class MathAnswer(Spec):
    """math-verify: 1.0 when the completion's last parsable expression equals the
    reference answer mathematically (``1/2`` = ``0.5`` = ``\\frac{1}{2}``), else 0.0.
    math-verify's own signal-based timeouts are off (they only work on the main thread);
    Verify's ``timeout`` bounds the call instead, in a worker process that is killed at
    it (:class:`stages.filter._math.MathScore`)."""

    type: Literal["math"] = "math"

    def scorer(self, ctx: StepContext) -> Scorer:
        from stages.filter._math import MathScore

        return MathScore()


class Match(Spec):
    """1.0 when the answer taken from the completion equals the reference answer.

    Without ``pattern`` the whole stripped completion is the answer; with one, the first
    group of its first match (or the whole match if it has no group). No match: 0.0.

    >>> Match(pattern=r"answer:\\s*(-?\\d+)")  # doctest: +ELLIPSIS
    Match(type='match', pattern='answer:\\\\s*(-?\\\\d+)', ...)
    """

    type: Literal["match"] = "match"
    pattern: str | None = None
    case_sensitive: bool = True

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except re.error as err:
                raise ValueError(f"pattern {value!r} is not a regular expression: {err}")
        return value

    def scorer(self, ctx: StepContext) -> Scorer:
        return _MatchScore(self.pattern, self.case_sensitive)


@dataclass(frozen=True)
class _MatchScore:
    """The scorer of :class:`Match`, an object a worker process can be sent."""

    pattern: str | None
    case_sensitive: bool

    def __call__(self, completion: str, answer: Any, meta: Any) -> float:
        if answer is None:
            raise ValueError("match verifier: the rollout has no reference answer")
        got = extract(completion, None if self.pattern is None else re.compile(self.pattern))
        want = str(answer).strip()
        if not self.case_sensitive:
            got, want = (None if got is None else got.casefold()), want.casefold()
        return float(got is not None and got == want)


def extract(completion: str, regex: re.Pattern | None) -> str | None:
    """The answer in ``completion``: all of it stripped, or the regex's first group."""
    if regex is None:
        return completion.strip()
    m = regex.search(completion)
    if m is None:
        return None
    return (m.group(1) if regex.groups else m.group(0)).strip()


_FENCE = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL)


class CodeTests(Spec):
    """Run the completion's code against the rollout's tests: the code in the sandbox,
    the verdict outside it (:mod:`stages.sandbox.harness`).

    The code is the first fenced ```python block of the completion (else the whole
    completion); the tests are ``meta["tests"]`` (a string, or a list of statements such
    as ``assert f(2) == 4``) or, failing that, the reference answer; each assert is judged
    outside the program (top-level asserts, asserts in loops and branches over
    the test's own values, HumanEval's ``check(candidate)``, ``try`` blocks expecting an
    exception; see :mod:`stages.sandbox.harness`, which refuses the forms it cannot
    judge). Reward: 1.0 when every assert holds, else 0.0. A program that crashed, that
    the sandbox had to stop (time, memory, processes, network, files), that is larger
    than ``sandbox.file_mb`` or is not text (a lone surrogate) raises :class:`Wrong`
    (:class:`SandboxViolation` for a limit): reward 0, the reason in ``score_error``,
    the rollout kept. Only a fault of the harness (a sandbox that did not start, tests
    it refuses) is a scorer failure. Without namespaces the scorer refuses to run unless
    ``sandbox`` opts in to ``isolation="unsafe"``, which warns on every step.
    """

    type: Literal["code"] = "code"
    sandbox: Sandbox = Sandbox()

    def scorer(self, ctx: StepContext) -> Scorer:
        if self.sandbox.isolation == "namespaces" and (reason := unavailable()) is not None:
            raise ValueError(refusal(reason))
        if self.sandbox.isolation == "unsafe":
            warnings.warn(f"run {ctx.run_id!r} step {ctx.step}: CodeTests runs model-written "
                          f"code with isolation='unsafe': the host's files, processes and "
                          f"network are in its reach", UnsafeSandbox, stacklevel=2)

        return _CodeScore(self.sandbox)


@dataclass(frozen=True)
class _CodeScore:
    """The scorer of :class:`CodeTests`, an object a worker process can be sent."""

    sandbox: Sandbox

    def __call__(self, completion: str, answer: Any, meta: Any) -> float:
        code, tests = code_and_tests(completion, answer, meta)
        _runnable(code, self.sandbox.file_mb)
        steps = plan(code, tests)
        outcome = run_python(steps.program, self.sandbox)
        last = (outcome.stderr.strip().splitlines()[-1:] or [""])[0][:200]
        if outcome.violation:
            raise SandboxViolation(f"sandbox {outcome.isolation}: {outcome.verdict} ({last})")
        if outcome.verdict != "ok":
            raise Wrong(f"the program crashed ({outcome.verdict}: {last})")
        return 1.0 if passed(steps, outcome.channel)[0] else 0.0

    def warm(self) -> None:
        """Probe the sandbox once, when a worker loads the scorer (not in its first call)."""
        if self.sandbox.isolation == "namespaces":
            unavailable()


def _runnable(code: str, file_mb: int) -> None:
    """:class:`Wrong` for code that cannot be run: larger than the largest file the
    sandbox lets a program write, or not text (a lone surrogate is no UTF-8)."""
    if len(code) > file_mb << 20:
        raise Wrong(f"the code is {len(code) / (1 << 20):.1f} MB, over the sandbox's "
                    f"file_mb={file_mb}")
    try:
        code.encode("utf-8")
    except UnicodeEncodeError as err:
        raise Wrong(f"the code is not text: a lone surrogate at character {err.start}") \
            from None


class UnsafeSandbox(UserWarning):
    """Model-written code runs without namespaces (``Sandbox(isolation="unsafe")``)."""


def code_and_tests(completion: str, answer: Any, meta: Any) -> tuple[str, str]:
    """The model's code and the tests a CodeTests verifier runs it against."""
    fenced = _FENCE.search(completion)
    code = fenced.group(1) if fenced else completion
    tests: Any = None
    if meta:
        parsed = json.loads(meta) if isinstance(meta, str) else meta
        tests = parsed.get("tests") if isinstance(parsed, dict) else None
    if tests is None:
        tests = answer
    if tests is None:
        raise ValueError("code verifier: the rollout has no tests (meta['tests'] or answer)")
    if isinstance(tests, (list, tuple)):
        tests = "\n".join(str(t) for t in tests)
    return code, str(tests)


class Function(Spec):
    """A user function ``(completion, answer, meta) -> float`` named ``module:function``."""

    type: Literal["function"] = "function"
    ref: str

    @field_validator("ref")
    @classmethod
    def _shape(cls, value: str) -> str:
        if value.count(":") != 1 or not all(value.split(":")):
            raise ValueError(f"ref must be 'module:function', got {value!r}")
        return value

    def scorer(self, ctx: StepContext) -> Scorer:
        return resolve(self.ref, "scorer")


VerifierSpec = Annotated[Union[TaskScore, MathAnswer, Match, CodeTests, Function, ListOrder],
                         Field(discriminator="type")]
"""Any verifier config, told apart by its ``type``."""

_SHORTHAND: dict[str, Callable[[], Verifier]] = {
    "task": TaskScore, "math": MathAnswer, "exact": Match, "code": CodeTests}


def from_shorthand(value: str) -> Verifier:
    """The verifier a Verify ``scorer`` string names; ValueError if it names none."""
    if value in _SHORTHAND:
        return _SHORTHAND[value]()
    if value.startswith("regex:"):
        return Match(pattern=value[len("regex:"):])
    if value.count(":") == 1:
        return Function(ref=value)
    raise ValueError(f"scorer must be one of {', '.join(repr(k) for k in _SHORTHAND)}, "
                     f"'regex:<pattern>' or 'module:function', got {value!r}")
