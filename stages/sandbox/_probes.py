"""The harness's rules for probes (see :mod:`stages.sandbox.harness`): which part of an
assert may run in the sandbox, and what of the test's may go in with it.

A probe is judged by its value alone, so it may only *produce* the program's values
(calls of the program's functions, attributes, subscripts, displays, comprehensions of
them); the test's data may enter only as inputs (arguments, indices, the iterables of
comprehensions), evaluated first (``case[0]``, never ``case``, which may hold the
expected value too).
"""

from __future__ import annotations

import ast
from typing import Any, Protocol

from stages.sandbox import _judge, _values

COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


class Walk(Protocol):
    """What the rules need of the walk (:class:`stages.sandbox._walk.Planner`)."""

    env: dict[str, Any]
    dynamic: set[str]
    defined: set[str]
    libraries: set[str]
    shared: set[str]

    def is_static_name(self, name: str) -> bool: ...
    def static(self, node: ast.expr, bound: set[str] | None = None) -> bool: ...


def refuse(node: ast.AST, why: str) -> ValueError:
    return ValueError(f"code verifier: test `{ast.unparse(node)[:200]}` {why}; only asserts "
                      f"the harness judges outside the program are run (a check the "
                      f"program's own process makes, the program can forge)")


def bound_inside(node: ast.AST) -> set[str]:
    """Names a comprehension or lambda inside ``node`` binds for itself."""
    names: set[str] = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.comprehension):
            names |= {n.id for n in ast.walk(sub.target) if isinstance(n, ast.Name)}
        elif isinstance(sub, ast.Lambda):
            names |= {a.arg for a in sub.args.args + sub.args.kwonlyargs}
    return names


def free_names(node: ast.AST) -> set[str]:
    """Names ``node`` reads that it does not bind itself."""
    read = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
    return read - bound_inside(node)


def has_assert(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Assert) for n in ast.walk(node))


def _root(node: ast.expr) -> str | None:
    """The name an expression like ``a.b(c).d`` starts from."""
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def _mixed(call: ast.Call, walk: Walk) -> bool:
    """Whether a call's arguments hold both the program's values and the test's data
    (each argument that is not static data must itself be a plain program value)."""
    parts = [*call.args, *(k.value for k in call.keywords)]
    program = [p for p in parts if not walk.static(p)]
    for part in program:
        outputs(part.value if isinstance(part, ast.Starred) else part, walk)
    return bool(program) and len(program) < len(parts)


def probed(node: ast.expr) -> bool:
    return any(isinstance(n, ast.Name) and n.id.startswith("__gfcr_p") for n in ast.walk(node))


def outputs(node: ast.expr, walk: Walk) -> None:
    """Refuse a probe that would compute with the program's values inside the sandbox
    where its result is judged: only calls, attributes, subscripts, comprehensions and
    displays of the program's values; static values only as inputs (arguments, indices,
    the iterables of comprehensions); no function the tests define judging a value."""
    if isinstance(node, ast.Name):
        if node.id in walk.env and node.id not in walk.shared:
            raise refuse(node, "uses a static value as a result inside the sandbox")
    elif isinstance(node, ast.Call):
        root = _root(node.func)
        if root in walk.defined:
            raise refuse(node, f"is judged by `{root}`, which the tests define and which "
                                f"runs in the sandbox, where the program can rewrite it")
        if (root not in walk.dynamic or root in walk.libraries) and _mixed(node, walk):
            raise refuse(node, f"passes the program's values and the test's own together to "
                                f"`{ast.unparse(node.func)[:60]}`, which is not the program's "
                                f"and runs in the sandbox, where the program can rewrite it")
        outputs(node.func, walk)
    elif isinstance(node, (ast.Attribute, ast.Subscript, ast.Starred)):
        outputs(node.value, walk)
    elif isinstance(node, COMPREHENSIONS):
        for part in ((node.key, node.value) if isinstance(node, ast.DictComp)
                     else (node.elt,)):
            outputs(part, walk)
    elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        for elt in node.elts:
            outputs(elt, walk)
    else:
        raise refuse(node, "computes with the program's values inside the sandbox, where "
                            "the program could forge the result")


class Inline(ast.NodeTransformer):
    """Each static part of an expression (``case[0]``, ``n + 1``) replaced by its value,
    so that only the value the program needs goes into the sandbox, never the static
    name it was taken from (``case`` may hold the expected value too)."""

    def __init__(self, walk: Walk, bound: set[str]) -> None:
        self.walk, self.bound = walk, bound

    def visit(self, node: ast.AST) -> ast.AST:
        if isinstance(node, ast.expr) and not isinstance(node, (ast.Name, ast.Constant)) \
                and isinstance(getattr(node, "ctx", ast.Load()), ast.Load) \
                and not free_names(node) & self.bound and self.walk.static(node):
            try:
                text = _values.source(_judge.evaluate(node, self.walk.env))
            except (ValueError, TypeError, ArithmeticError, LookupError, RecursionError):
                return super().visit(node)
            return ast.parse(text, mode="eval").body
        return super().visit(node)
