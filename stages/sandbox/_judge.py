"""The harness's own evaluator: the part of each test that is judged outside the sandbox.

It evaluates a small, pure subset of Python over plain data: literals, names bound to
the test's static values (or to values measured in the sandbox), arithmetic,
comparisons, boolean logic, subscripts, comprehensions, and a fixed list of pure
functions (``abs``, ``len``, ``sorted``, ``set``, ``math.isclose``, ``Fraction``, ...).
It never calls anything a program made: every value it sees is either the test's own or
one decoded by :mod:`stages.sandbox._values`. Sizes are bounded (a long repeat, a huge
power), so a value from the program cannot make the judgement itself run away.
"""

from __future__ import annotations

import ast
import collections
import math
import operator
import random
from decimal import Decimal
from fractions import Fraction
from typing import Any, Callable

_LIMIT = 1 << 20
"""Longest sequence, and most bits of an integer, an operation may build."""

FUNCTIONS: dict[str, Any] = {f.__name__: f for f in (
    abs, len, min, max, sum, sorted, set, frozenset, list, tuple, dict, round, int, float,
    str, bool, complex, range, reversed, enumerate, zip, all, any, isinstance, divmod,
    repr, chr, ord)} | {"Fraction": Fraction, "Decimal": Decimal}
"""The builtins (and the two number types) the judge may call, by name."""

MODULES: dict[str, dict[str, Any]] = {
    "math": {n: getattr(math, n) for n in ("isclose", "fabs", "sqrt", "floor", "ceil", "pi",
                                           "e", "inf", "nan", "isnan", "isinf", "gcd",
                                           "log", "exp", "sin", "cos", "tan", "atan",
                                           "hypot", "trunc")},
    "fractions": {"Fraction": Fraction}, "decimal": {"Decimal": Decimal},
    "collections": {n: getattr(collections, n) for n in ("namedtuple", "Counter",
                                                         "OrderedDict", "defaultdict")},
}
"""Modules a test may import for the judge's use, with the members it may use. ``random``
is one too: a seeded generator of the judge's own (see :func:`_generator`), so the
inputs a test draws are drawn outside and sent in, and its expected values computed
from them stay outside."""

_DRAWS = ("randint", "random", "choice", "uniform", "sample", "randrange", "gauss")


def _generator(seed: Any = 0) -> "Module":
    rng = random.Random(seed)
    members = {n: getattr(rng, n) for n in _DRAWS}
    return Module("random", members | {"Random": _generator, "seed": rng.seed})


_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
    ast.Pow: operator.pow, ast.BitAnd: operator.and_, ast.BitOr: operator.or_,
    ast.BitXor: operator.xor, ast.LShift: operator.lshift, ast.RShift: operator.rshift}
_COMPARE: dict[type, Callable[[Any, Any], Any]] = {
    ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
    ast.Gt: operator.gt, ast.GtE: operator.ge, ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b, ast.Is: operator.is_, ast.IsNot: operator.is_not}
_UNARY: dict[type, Callable[[Any], Any]] = {
    ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Not: operator.not_,
    ast.Invert: operator.invert}


class Unjudgeable(ValueError):
    """An expression outside the subset the judge evaluates."""


def _size(value: Any) -> Any:
    if isinstance(value, int) and value.bit_length() > _LIMIT:
        raise OverflowError("an integer too large to judge")
    if isinstance(value, (str, bytes, list, tuple)) and len(value) > _LIMIT:
        raise OverflowError("a sequence too long to judge")
    return value


def _binary(op: ast.operator, left: Any, right: Any) -> Any:
    if isinstance(op, (ast.Pow, ast.LShift)) and isinstance(right, int) and \
            isinstance(left, (int, Fraction)):
        base = Fraction(left)
        if abs(right) * (base.numerator.bit_length() + base.denominator.bit_length()) > _LIMIT:
            raise OverflowError("a power too large to judge")
    if isinstance(op, ast.Mult):
        for seq, count in ((left, right), (right, left)):
            if isinstance(seq, (str, bytes, list, tuple)) and isinstance(count, int) \
                    and len(seq) * count > _LIMIT:
                raise OverflowError("a repeat too long to judge")
    return _size(_BINARY[type(op)](left, right))


def _compare(node: ast.Compare, env: dict[str, Any]) -> Any:
    left = evaluate(node.left, env)
    for op, right_node in zip(node.ops, node.comparators):
        right = evaluate(right_node, env)
        if not _COMPARE[type(op)](left, right):
            return False
        left = right
    return True


def _callable(func: Any, node: ast.Call, env: dict[str, Any]) -> bool:
    """Whether the judge calls ``func``: a listed function, a module's member, or a
    tuple class ``namedtuple`` made."""
    if isinstance(node.func, ast.Attribute):
        return True  # evaluate() gave a member of a Module, or raised
    if isinstance(func, type) and issubclass(func, tuple) and hasattr(func, "_fields"):
        return True
    return any(func is f for f in FUNCTIONS.values()) or \
        any(func is f for m in MODULES.values() for f in m.values())


def _call(node: ast.Call, env: dict[str, Any]) -> Any:
    func = evaluate(node.func, env)
    if not _callable(func, node, env):
        raise Unjudgeable(f"`{ast.unparse(node.func)}` is not a function the judge calls")
    args: list[Any] = []
    for arg in node.args:
        if isinstance(arg, ast.Starred):
            args.extend(evaluate(arg.value, env))
        else:
            args.append(evaluate(arg, env))
    kwargs = {k.arg: evaluate(k.value, env) for k in node.keywords if k.arg is not None}
    if func is range and len(range(*args)) > _LIMIT:
        raise OverflowError("a range too long to judge")
    return _size(func(*args, **kwargs))


def _comprehension(node: ast.expr, env: dict[str, Any]) -> Any:
    gens = node.generators  # type: ignore[attr-defined]
    out: list[Any] = []

    def loop(i: int, scope: dict[str, Any]) -> None:
        if i == len(gens):
            if isinstance(node, ast.DictComp):
                out.append((evaluate(node.key, scope), evaluate(node.value, scope)))
            else:
                out.append(evaluate(node.elt, scope))  # type: ignore[attr-defined]
            _size(out)
            return
        for item in evaluate(gens[i].iter, scope):
            inner = dict(scope)
            bind(gens[i].target, item, inner)
            if all(evaluate(cond, inner) for cond in gens[i].ifs):
                loop(i + 1, inner)
    loop(0, env)
    kind = {ast.ListComp: list, ast.SetComp: set, ast.DictComp: dict, ast.GeneratorExp: list}
    return kind[type(node)](out)


def bind(target: ast.expr, value: Any, env: dict[str, Any]) -> None:
    """Bind an assignment or loop target (a name, or a tuple or list of targets)."""
    if isinstance(target, ast.Name):
        env[target.id] = value
    elif isinstance(target, (ast.Tuple, ast.List)):
        items = list(value)
        if len(items) != len(target.elts):
            raise ValueError(f"cannot unpack {len(items)} values into "
                             f"`{ast.unparse(target)}`")
        for t, v in zip(target.elts, items):
            bind(t, v, env)
    else:
        raise Unjudgeable(f"the target `{ast.unparse(target)}` is not a name or a tuple")


def evaluate(node: ast.expr, env: dict[str, Any]) -> Any:
    """The value of ``node`` with names from ``env`` (then the judge's functions and
    modules); :class:`Unjudgeable` for anything outside the subset."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        for scope in (env, FUNCTIONS):
            if node.id in scope:
                return scope[node.id]
        raise Unjudgeable(f"`{node.id}` is not known outside the sandbox")
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and \
            isinstance(env.get(node.value.id), Module):
        return env[node.value.id].member(node.attr)
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        items = [evaluate(e, env) for e in node.elts]
        return {ast.Tuple: tuple, ast.List: list, ast.Set: set}[type(node)](items)
    if isinstance(node, ast.Dict) and all(k is not None for k in node.keys):
        return {evaluate(k, env): evaluate(v, env)  # type: ignore[arg-type]
                for k, v in zip(node.keys, node.values)}
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        return _binary(node.op, evaluate(node.left, env), evaluate(node.right, env))
    if isinstance(node, ast.UnaryOp):
        return _UNARY[type(node.op)](evaluate(node.operand, env))
    if isinstance(node, ast.BoolOp):
        value: Any = None
        for part in node.values:
            value = evaluate(part, env)
            if bool(value) == isinstance(node.op, ast.Or):
                return value
        return value
    if isinstance(node, ast.Compare):
        return _compare(node, env)
    if isinstance(node, ast.IfExp):
        return evaluate(node.body if evaluate(node.test, env) else node.orelse, env)
    if isinstance(node, ast.Subscript):
        return evaluate(node.value, env)[evaluate(node.slice, env)]
    if isinstance(node, ast.Slice):
        return slice(*(None if p is None else evaluate(p, env)
                       for p in (node.lower, node.upper, node.step)))
    if isinstance(node, ast.Call):
        return _call(node, env)
    if isinstance(node, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
        return _comprehension(node, env)
    raise Unjudgeable(f"`{ast.unparse(node)[:80]}` is not an expression the judge evaluates")


class Module:
    """An imported module (or a judge's random generator) as the judge sees it: only its
    listed members."""

    def __init__(self, name: str, members: dict[str, Any] | None = None) -> None:
        self.name = name
        self.members: dict[str, Any] = MODULES[name] if members is None else members

    def member(self, attr: str) -> Any:
        members = self.members
        if attr not in members:
            raise Unjudgeable(f"`{self.name}.{attr}` is not a member the judge uses")
        return members[attr]


MODULES["random"] = _generator().members
