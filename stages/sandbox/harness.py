"""The code-test harness: the model's code runs in the sandbox, the verdict is taken outside.

A program that runs its own tests can forge them: ``os._exit(0)`` before the tests ends
the process as a pass, and a returned object whose ``__eq__`` always says True passes any
``assert f(x) == y``; any check made inside the program's process is at its mercy, since
the model's code runs first and may rewrite anything there. So :func:`plan` splits the
tests, walking them in the order they run:

- *static* statements (``cases = [(1, 2), ...]``, ``import math``, a ``for`` over a
  static iterable, an ``if`` on a static condition) are evaluated by the harness's own
  judge (:mod:`stages.sandbox._judge`); loops are unrolled, a check function
  (HumanEval's ``def check(candidate): ...`` then ``check(f)``) is inlined;
- every ``assert`` (at the top, in such a loop, branch or check function) becomes a
  *check*: its expression is split into *probes*, the parts that need the program
  (``f(x)``, ``candidate(*args)``), which run in the sandbox with the static inputs
  they name passed in, and the rest (the comparison, ``abs``, ``math.isclose``, the
  expected values), which the judge evaluates outside on the probes' values;
- the probes' values come back through the result channel (fd 3) in the tagged encoding
  of :mod:`stages.sandbox._values`: data only, never the program's objects;
- other statements (statements that call the program, its helper definitions) run in
  the sandbox in order, with the static values they use sent in.

Refused, with the reason (:class:`ValueError`): an assert whose verdict would be decided
inside the sandbox: one comparing only values computed there, one that calculates with a
probe's value inside a probe (``[f(x) == y for ...]``), one judged by a function the
tests define (it runs in the sandbox, where the program can rewrite it), or one in a
loop, branch, ``try`` or function the harness cannot unroll. A ``try`` that expects an
exception (``try: f(-1); assert False`` / ``except ValueError: pass``) is a check that
the probe raised it. A program that knows no expected value can only pass by computing
it.
"""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass
from typing import Any

from stages.sandbox import _judge, _values
from stages.sandbox._walk import Check, Planner

__all__ = ["Check", "Plan", "passed", "plan"]


@dataclass(frozen=True)
class Plan:
    """What runs in the sandbox (``program``) and what is checked outside (``checks``)."""

    program: str
    checks: tuple[Check, ...]
    probes: int


def plan(code: str, tests: str) -> Plan:
    """The sandboxed program for ``code`` and ``tests``; ValueError naming a test that is
    not of a form the harness can check outside the program."""
    try:
        statements = ast.parse(tests).body
    except SyntaxError as err:
        raise ValueError(f"code verifier: the tests do not parse: {err}") from None
    except (RecursionError, MemoryError):
        raise ValueError("code verifier: the tests are nested too deeply to parse") from None
    walk = Planner(_names(code))
    try:
        for node in statements:
            walk.statement(node)
        walk.finish()
    except (TypeError, ArithmeticError, LookupError, RecursionError) as err:
        raise ValueError(f"code verifier: the tests' own static code raised "
                         f"{type(err).__name__}: {str(err)[:200]}") from None
    if not walk.checks:
        raise ValueError("code verifier: the tests hold no assert")
    body = "\n".join(walk.lines)
    program = (f"{code}\n\n# --- the harness: probes' values go to fd 3; the verdict is "
               f"taken outside\n{_values.PRELUDE}\n{body}\n__gfcr_finish(__gfcr_values)\n")
    return Plan(program, tuple(walk.checks), walk.count)


def _names(code: str) -> set[str]:
    """Every name the program's code binds (so a builtin it shadows is the program's)."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return set()
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and
             isinstance(n.ctx, ast.Store)}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {a.asname or a.name.split(".")[0] for a in node.names}
    return names


def passed(steps: Plan, channel: str) -> tuple[bool, str]:
    """Whether every check passed, from what the program wrote to the result channel;
    and, when not, which check failed first and how."""
    try:
        entries = json.loads(channel)
    except (ValueError, RecursionError):
        return False, "the tests did not run to the end (no result from the harness)"
    if not isinstance(entries, list) or len(entries) != steps.probes or \
            not all(isinstance(e, list) and len(e) == 2 for e in entries):
        return False, "the harness's result is malformed"
    for check in steps.checks:
        ok, why = _judged(check, entries)
        if not ok:
            return False, f"`{check.source[:200]}`: {why}"
    return True, ""


def _judged(check: Check, entries: list[Any]) -> tuple[bool, str]:
    """One check's outcome from the probes' entries (``["ok", value]``, ``["raised",
    [class names]]``, ``["unreadable", why]``)."""
    env = dict(check.env)
    for k in check.probes:
        kind, body = entries[k]
        if check.raises:
            names = body if kind == "raised" and isinstance(body, list) else []
            if set(map(str, names)) & set(check.raises):
                return True, ""
            if kind == "raised":
                return False, f"raised {str(names[:1])[:100]}, not {' or '.join(check.raises)}"
            continue
        if kind != "ok":
            return False, f"{'raised' if kind == 'raised' else 'unreadable'}: {str(body)[:200]}"
        try:
            env[f"__gfcr_p{k}"] = _values.decode(body)
        except (ValueError, TypeError, RecursionError, ArithmeticError) as err:
            return False, f"the value is malformed ({err})"
    if check.raises:
        return False, f"raised nothing, not {' or '.join(check.raises)}"
    assert check.judge is not None
    try:
        return (bool(_judge.evaluate(check.judge, env)), "the assert is false")
    except (ArithmeticError, ValueError, TypeError, KeyError, IndexError, RecursionError,
            MemoryError, AttributeError) as err:
        return False, f"judging it raised {type(err).__name__}: {str(err)[:200]}"
