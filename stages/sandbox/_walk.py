"""The harness's walk over the tests (see :mod:`stages.sandbox.harness`): static statements
evaluated, loops unrolled, check functions inlined, asserts split into probes.

The walk keeps ``env``, the static values bound so far (the judge's to use, and sent
into the sandbox only as inputs), and ``dynamic``, the names bound in the sandbox. A
name neither static nor bound by the tests is the program's (or a builtin's).
"""

from __future__ import annotations

import ast
import copy
from dataclasses import dataclass
from typing import Any

from stages.sandbox import _judge, _values
from stages.sandbox._probes import (COMPREHENSIONS, Inline, bound_inside, free_names,
                                   has_assert, outputs, probed, refuse)

MAX_PROBES = 20_000
"""Most probes one test suite may unroll to."""
MAX_STEPS = 200_000
"""Most statements the walk may visit, loops unrolled."""

_CONVERSIONS = frozenset({"list", "tuple", "set", "frozenset", "sorted", "dict", "str",
                          "len", "sum", "min", "max"})
"""Judge functions that, applied to a program's value alone, run in the sandbox with it
(``list(f(x))`` of a generator): their inputs are the program's, not the test's."""


@dataclass(frozen=True, eq=False)
class Check:
    """One assert: the judge's expression over static values and probe values, or
    (``raises``) the exceptions one of its probes must raise."""

    source: str
    judge: ast.expr | None
    env: dict[str, Any]
    probes: tuple[int, ...]
    raises: tuple[str, ...] = ()


class Planner:
    """Walks test statements in the order they run; collects the sandbox's lines and the
    checks judged outside."""

    def __init__(self, program_names: set[str]) -> None:
        self.env: dict[str, Any] = {"__name__": "__main__"}
        self.dynamic: set[str] = set(program_names)
        self.defined: set[str] = set()
        self.check_functions: dict[str, ast.FunctionDef] = {}
        self.lines: list[str] = []
        self.checks: list[Check] = []
        self.count = 0
        self.steps = 0
        self.called: set[str] = set()
        self.libraries: set[str] = set()
        self.shared: set[str] = set()
        """Static names that exist in the sandbox too (modules, their members, tuple
        classes the tests define): never sent in as values."""

    # --- what is static -------------------------------------------------------------
    def is_static_name(self, name: str) -> bool:
        return name in self.env or (name not in self.dynamic and name in _judge.FUNCTIONS)

    def static(self, node: ast.expr, bound: set[str] | None = None) -> bool:
        """Whether the judge can evaluate ``node`` from the static values alone (and
        the ``bound`` names, a comprehension's targets, when given)."""
        if not all(self.is_static_name(n) for n in free_names(node) - (bound or set())):
            return False
        for sub in ast.walk(node):
            if isinstance(sub, (ast.Lambda, ast.NamedExpr, ast.Await, ast.Yield,
                                ast.YieldFrom, ast.JoinedStr, ast.Starred)):
                return False
            if isinstance(sub, ast.Attribute) and not (
                    isinstance(sub.value, ast.Name) and
                    isinstance(self.env.get(sub.value.id), _judge.Module)):
                return False
        return True

    # --- statements -----------------------------------------------------------------
    def statement(self, node: ast.stmt) -> None:
        self.steps += 1
        if self.steps > MAX_STEPS:
            raise refuse(node, f"takes the tests past {MAX_STEPS} statements unrolled")
        judged = has_assert(node) or any(isinstance(n, ast.Raise) for n in ast.walk(node))
        if isinstance(node, ast.Assert):
            self.assertion(node)
        elif isinstance(node, ast.FunctionDef) and has_assert(node):
            self.check_functions[node.name] = node
            self.dynamic.add(node.name)
        elif isinstance(node, ast.Expr) and self.inline(node.value):
            pass
        elif isinstance(node, ast.For) and not node.orelse and (has_assert(node) or (
                self.sends(node) and self.static(node.iter))):
            self.unroll(node)  # also a loop over cases that would send them all in
        elif isinstance(node, ast.If) and has_assert(node):
            if not self.static(node.test):
                raise refuse(node.test, "is a condition on the program's values around "
                                         "an assert")
            for inner in node.body if _judge.evaluate(node.test, self.env) else node.orelse:
                self.statement(inner)
        elif isinstance(node, ast.Try) and judged:
            self.expects_raise(node)
        elif has_assert(node):
            raise refuse(node, f"holds an assert in a {type(node).__name__.lower()} "
                                f"statement the harness cannot unroll")
        elif judged and not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef,
                                              ast.ClassDef)):
            raise refuse(node, "fails a test by raising, which the program would decide "
                               "inside the sandbox; write it as an assert")
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            self.imports(node)
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and \
                self.static(node.value) and self.assign(node.targets[0], node.value):
            pass
        elif not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)) \
                and not isinstance(node, ast.Pass):
            self.emit(node)

    def sends(self, node: ast.stmt) -> bool:
        """Whether running ``node`` in the sandbox would send static names in."""
        return bool(free_names(node) & set(self.env) - self.shared)

    def emit(self, node: ast.stmt) -> None:
        """Run ``node`` in the sandbox: the static values it computes with go in as
        values (``case[0]``, not ``case``), the static names it reads go in first."""
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Expr)):
            node = Inline(self, set()).visit(copy.deepcopy(node))  # type: ignore[assignment]
        for name in sorted(free_names(node) & set(self.env) - self.shared):
            value = self.env.pop(name)
            self.dynamic.add(name)
            self.lines.append(f"{name} = {self._source(node, value)}")
        for sub in ast.walk(node):
            if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store):
                self.dynamic.add(sub.id)
            elif isinstance(sub, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
                self.dynamic.add(sub.name)
                self.defined.add(sub.name)
        for name in self.dynamic:
            self.env.pop(name, None)
            self.shared.discard(name)
        self.lines.append(ast.unparse(node))

    def finish(self) -> None:
        """pytest-style ``def test_...():`` functions the tests never call run now."""
        for name, func in list(self.check_functions.items()):
            if name.startswith("test") and not func.args.args and name not in self.called:
                self.inline(ast.Call(ast.Name(name, ast.Load()), [], []))

    def _source(self, node: ast.AST, value: Any) -> str:
        try:
            return _values.source(value)
        except ValueError as err:
            raise refuse(node, f"needs a value the harness cannot send in ({err})") from None

    def assign(self, target: ast.expr, value: ast.expr) -> bool:
        """Bind a static assignment outside the sandbox; False to run it inside."""
        try:
            result = _judge.evaluate(value, self.env)
            scope: dict[str, Any] = {}
            _judge.bind(target, result, scope)
        except (ValueError, TypeError, ArithmeticError, LookupError, RecursionError):
            return False
        for name, bound in scope.items():
            self.env[name] = bound
            self.dynamic.discard(name)
            self.shared.discard(name)
            if isinstance(bound, (type, _judge.Module)):  # a tuple class, a generator
                self.shared.add(name)
                self.lines.append(ast.unparse(ast.Assign([target], value, lineno=0)))
        return True

    def imports(self, node: ast.Import | ast.ImportFrom) -> None:
        """An import runs in the sandbox; the judge's modules are bound outside too."""
        self.lines.append(ast.unparse(node))
        for alias in node.names:
            bound = alias.asname or alias.name.split(".")[0]
            if isinstance(node, ast.Import) and alias.name in _judge.MODULES:
                self.env[bound] = _judge.Module(alias.name)
                self.dynamic.discard(bound)
                self.shared.add(bound)
            elif isinstance(node, ast.ImportFrom) and node.module in _judge.MODULES and \
                    alias.name in _judge.MODULES[node.module]:
                self.env[bound] = _judge.MODULES[node.module][alias.name]
                self.dynamic.discard(bound)
                self.shared.add(bound)
            else:
                self.dynamic.add(bound)
                self.libraries.add(bound)
                self.env.pop(bound, None)

    def inline(self, call: ast.expr) -> bool:
        """``check(f)`` of a check function: its body walked with its parameters bound."""
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and
                call.func.id in self.check_functions):
            return False
        func = self.check_functions[call.func.id]
        self.called.add(func.name)
        params = [a.arg for a in func.args.args]
        if call.keywords or len(call.args) != len(params) or func.args.vararg or \
                func.args.kwonlyargs or func.args.kwarg:
            raise refuse(call, "calls a check function other than with one argument "
                                "for each of its parameters")
        renames: dict[str, str] = {}
        for param, arg in zip(params, call.args):
            if isinstance(arg, ast.Name) and not self.static(arg):
                renames[param] = arg.id
            elif self.static(arg):
                self.env[param] = _judge.evaluate(arg, self.env)
                self.dynamic.discard(param)
            else:
                raise refuse(call, "passes a check function an argument that is neither "
                                    "a name nor a static value")
        body = _Rename(renames).visit(ast.Module(body=copy.deepcopy(func.body), type_ignores=[]))
        for inner in body.body:
            self.statement(inner)
        return True

    def unroll(self, node: ast.For) -> None:
        if not self.static(node.iter):
            raise refuse(node.iter, "is a loop over the program's values around an assert")
        if any(isinstance(n, (ast.Break, ast.Continue)) for n in ast.walk(node)):
            raise refuse(node, "breaks or continues a loop around an assert")
        for item in _judge.evaluate(node.iter, self.env):
            _judge.bind(node.target, item, self.env)
            for name in free_names(node.target):
                self.dynamic.discard(name)
            for inner in node.body:
                self.statement(inner)
            if self.count > MAX_PROBES:
                raise refuse(node, f"unrolls to more than {MAX_PROBES} probes")

    # --- asserts ----------------------------------------------------------------------
    def assertion(self, node: ast.Assert) -> None:
        first = self.count
        judge = self.split(node.test)
        if self.count > MAX_PROBES:
            raise refuse(node, f"takes the tests past {MAX_PROBES} probes")
        self.checks.append(Check(ast.unparse(node), judge, dict(self.env),
                                 tuple(range(first, self.count))))

    def split(self, node: ast.expr) -> ast.expr:
        """``node`` with each part that needs the program replaced by a probe's name."""
        if self.static(node):
            return node
        if isinstance(node, ast.Compare):
            parts = [self.split(p) for p in (node.left, *node.comparators)]
            if all(probed(p) for p in parts):
                raise refuse(node, "compares only values computed in the sandbox")
            return ast.Compare(parts[0], node.ops, parts[1:])
        if isinstance(node, ast.BoolOp):
            return ast.BoolOp(node.op, [self.split(v) for v in node.values])
        if isinstance(node, ast.UnaryOp):
            return ast.UnaryOp(node.op, self.split(node.operand))
        if isinstance(node, ast.BinOp):
            return ast.BinOp(self.split(node.left), node.op, self.split(node.right))
        if isinstance(node, ast.Set):
            return ast.Set([self.split(e) for e in node.elts])
        if isinstance(node, (ast.Tuple, ast.List)):
            return type(node)([self.split(e) for e in node.elts], ast.Load())
        if isinstance(node, COMPREHENSIONS) and self.judged_outside(node):
            first, *rest = node.generators
            gens = [ast.comprehension(first.target, self.split(first.iter), first.ifs,
                                      first.is_async), *rest]
            if isinstance(node, ast.DictComp):
                return ast.DictComp(node.key, node.value, gens)
            return type(node)(node.elt, gens)
        if isinstance(node, ast.Call) and self.static(node.func) and not (
                isinstance(node.func, ast.Name) and node.func.id in _CONVERSIONS and
                len(node.args) == 1 and not node.keywords):
            return ast.Call(node.func, [self.split(a) for a in node.args],
                            [ast.keyword(k.arg, self.split(k.value)) for k in node.keywords])
        return self.probe(node)

    def judged_outside(self, node: ast.expr) -> bool:
        """Whether a comprehension over the program's values judges them with the test's
        own expressions (``all(v > 0 for v in f(x))``): its element and conditions are
        static given its targets, so only its iterables need the program."""
        targets = bound_inside(node)
        gens: list[ast.comprehension] = node.generators  # type: ignore[attr-defined]
        parts = [node.key, node.value] if isinstance(node, ast.DictComp) else \
            [node.elt]  # type: ignore[attr-defined]
        static = [*parts, *(c for g in gens for c in g.ifs), *(g.iter for g in gens[1:])]
        return all(self.static(p, targets) for p in static)

    def probe(self, node: ast.expr) -> ast.expr:
        """Send ``node`` into the sandbox as a probe; its value comes back by name."""
        outputs(node, self)
        node = Inline(self, bound_inside(node)).visit(copy.deepcopy(node))  # type: ignore[assignment]
        inputs = sorted(n for n in free_names(node) if n in self.env and n not in self.shared)
        params = ", ".join(f"{n}={self._source(node, self.env[n])}" for n in inputs)
        self.lines.append(f"__gfcr_values.append(__gfcr_probe(lambda {params}: "
                          f"({ast.unparse(node)})))")
        self.count += 1
        return ast.Name(f"__gfcr_p{self.count - 1}", ast.Load())

    def expects_raise(self, node: ast.Try) -> None:
        """``try: <calls>; assert False`` (or ``else: assert False``) ``except E: pass``:
        a check that one of the calls raised E."""
        body, tail = node.body, node.orelse
        if not tail:
            body, tail = node.body[:-1], node.body[-1:]
        falsy = len(tail) == 1 and (
            isinstance(tail[0], ast.Assert) and isinstance(tail[0].test, ast.Constant) and
            not tail[0].test.value or isinstance(tail[0], ast.Raise))
        names: list[str] = []
        for handler in node.handlers:
            kinds = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
            if not all(isinstance(k, ast.Name) for k in kinds) or has_assert(handler):
                falsy = False
            names += [k.id for k in kinds if isinstance(k, ast.Name)]
        if not (falsy and names and body and not node.finalbody and
                all(isinstance(s, ast.Expr) for s in body)):
            raise refuse(node, "is a try block the harness cannot judge (it judges `try: "
                                "<calls>; assert False` / `except <Error>: pass`)")
        first = self.count
        for stmt in body:
            assert isinstance(stmt, ast.Expr)
            self.probe(stmt.value)
        self.checks.append(Check(ast.unparse(node), None, {},
                                 tuple(range(first, self.count)), tuple(names)))


class _Rename(ast.NodeTransformer):
    """A check function's parameters renamed to the names it was called with."""

    def __init__(self, renames: dict[str, str]) -> None:
        self.renames = renames

    def visit_Name(self, node: ast.Name) -> ast.Name:
        return ast.Name(self.renames.get(node.id, node.id), node.ctx)
