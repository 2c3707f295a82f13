"""The code-test harness: the model's code runs in the sandbox, the verdict is taken outside.

A program that runs its own tests can forge them: ``os._exit(0)`` before the tests ends
the process as a pass, and a returned object whose ``__eq__`` always says True passes any
``assert f(x) == y``; any check made inside the program's process is at its mercy, since
the model's code runs first and may rewrite anything there. So the tests are split:

- each test ``assert <expression> == <literal>`` (either side the literal) becomes a
  *check*: only the expression enters the sandbox; the harness appended to the model's
  code evaluates it and writes its ``repr`` to the result channel (fd 3);
- the parent parses each value back with ``ast.literal_eval`` (plain ints, strings,
  lists, ...: none of the program's objects leave the sandbox) and compares it with the
  literal, which never entered the sandbox. A missing, unparsable or different value
  fails its check; the reward is 1.0 only when every check passes.

Other statements in the tests (imports, assignments, helper definitions) run in the
sandbox, in order, before the checks after them. Any other ``assert`` is refused: its
outcome would be decided inside the program. A program that knows no expected value can
only pass by computing it.
"""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass
from typing import Any

_CHANNEL = 3


@dataclass(frozen=True)
class Check:
    """One test: the expression the program computes and the literal it must equal."""

    expression: str
    expected: Any
    source: str


@dataclass(frozen=True)
class Plan:
    """What runs in the sandbox (``program``) and what is checked outside (``checks``)."""

    program: str
    checks: tuple[Check, ...]


def plan(code: str, tests: str) -> Plan:
    """The sandboxed program for ``code`` and ``tests``; ValueError naming a test that is
    not of a form the harness can check outside the program."""
    try:
        statements = ast.parse(tests).body
    except SyntaxError as err:
        raise ValueError(f"code verifier: the tests do not parse: {err}") from None
    lines = ["", "# --- tests: values go to fd 3, the verdict is taken outside the program",
             "__gfcr_values = []",
             "def __gfcr_value(thunk):",
             "    try:",
             "        return repr(thunk())",
             "    except BaseException:",
             "        return None"]
    checks: list[Check] = []
    for node in statements:
        check = _check(node)
        if check is None:
            lines.append(ast.unparse(node))
            continue
        checks.append(check)
        lines.append(f"__gfcr_values.append(__gfcr_value(lambda: ({check.expression})))")
    if not checks:
        raise ValueError("code verifier: the tests hold no `assert <expression> == <literal>`")
    lines += ["import json as __gfcr_json",
              f"with open({_CHANNEL}, 'w', closefd=False) as __gfcr_out:",
              "    __gfcr_out.write(__gfcr_json.dumps(__gfcr_values))", ""]
    return Plan(code + "\n" + "\n".join(lines), tuple(checks))


def _check(node: ast.stmt) -> Check | None:
    """The check an assert statement makes; None for a statement that is not an assert."""
    if not isinstance(node, ast.Assert):
        return None
    source = ast.unparse(node)
    test = node.test
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq):
        left, right = test.left, test.comparators[0]
        for expr, literal in ((left, right), (right, left)):
            try:
                expected = ast.literal_eval(literal)
            except (ValueError, TypeError, SyntaxError, RecursionError):
                continue
            return Check(ast.unparse(expr), expected, source)
    raise ValueError(f"code verifier: test `{source[:200]}` is not `assert <expression> == "
                     f"<literal>`; only such tests are checked outside the program (a check "
                     f"the program's own process makes, the program can forge)")


def passed(checks: tuple[Check, ...], channel: str) -> tuple[bool, str]:
    """Whether every check passed, from what the program wrote to the result channel;
    and, when not, which check failed first and how."""
    try:
        values = json.loads(channel)
    except (ValueError, RecursionError):
        return False, "the tests did not run to the end (no result from the harness)"
    if not isinstance(values, list) or len(values) != len(checks):
        return False, "the harness's result is malformed"
    for check, value in zip(checks, values):
        if not isinstance(value, str):
            return False, f"`{check.source[:200]}`: the expression raised"
        try:
            got = ast.literal_eval(value)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            return False, f"`{check.source[:200]}`: the value is not a plain literal"
        if not _equal(got, check.expected):
            return False, f"`{check.source[:200]}`: got {value[:200]}"
    return True, ""


def _equal(got: Any, expected: Any) -> bool:
    try:
        return bool(got == expected)
    except (RecursionError, MemoryError):
        return False
