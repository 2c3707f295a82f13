"""Values across the sandbox wall: a tagged encoding that keeps Python's plain data types.

The harness measures values inside the sandbox and judges them outside, so what comes
back must be data, never the program's objects (an object whose ``__eq__`` always
answers True would pass any check made with it). :data:`PRELUDE` runs in the sandbox
before the model's code and defines ``__gfcr_encode``: it reads a value's *storage*
through the base type's own methods (``int.__repr__``, ``tuple.__iter__``, ...), so a
subclass's overrides are never called, and encodes it as tagged JSON. What it keeps:
None, bool, int, float, complex, str, bytes, list, tuple (a namedtuple as the tuple it
is, so it equals its tuple as in Python), dict, set, frozenset, Fraction, Decimal.
Anything else is refused there (the check that needed it fails).

:func:`decode` is the parent's side: it checks every tag, bounds the depth, and rebuilds
plain values; a malformed document raises ``ValueError``. :func:`source` writes a
static value as Python source, for the *inputs* the harness sends into the sandbox.
"""

from __future__ import annotations

import math
from decimal import Decimal
from fractions import Fraction
from typing import Any

DEPTH = 64
"""Deepest nesting either side accepts."""

PRELUDE = '''\
def __gfcr_prelude():
    import fractions, decimal, json
    base = (bool, int, float, complex, str, bytes, tuple, list, dict, frozenset, set,
            fractions.Fraction, decimal.Decimal)
    issub, tname, dumps = issubclass, type, json.dumps

    def encode(v, depth=0):
        t = tname(v)
        if depth > %(depth)d:
            raise ValueError("nested too deep")
        if v is None:
            return None
        if t is bool:
            return v
        if t is base[11] or t is base[12]:
            return ["fraction" if t is base[11] else "decimal", str(v)]
        for kind in base[1:11]:
            if issub(t, kind):
                break
        else:
            raise TypeError(t.__name__)
        if kind in (int, float, complex):
            return [kind.__name__, kind.__repr__(v)]
        if kind is str:
            return ["str", str.__str__(v)]
        if kind is bytes:
            return ["bytes", bytes.hex(v)]
        if kind is dict:
            return ["dict", [[encode(k, depth + 1), encode(x, depth + 1)]
                             for k, x in dict.items(v)]]
        items = [encode(x, depth + 1) for x in kind.__iter__(v)]
        return [kind.__name__, items]

    def probe(thunk):
        try:
            value = thunk()
        except BaseException as err:
            return ["raised", [c.__name__ for c in tname(err).__mro__]]
        try:
            return ["ok", encode(value)]
        except BaseException as err:
            return ["unreadable", tname(value).__name__[:100] + ": " + str(err)[:100]]

    def finish(values):
        with open(3, "w", closefd=False) as out:
            out.write(dumps(values))
    return probe, finish

__gfcr_probe, __gfcr_finish = __gfcr_prelude()
__gfcr_values = []
del __gfcr_prelude
''' % {"depth": DEPTH}

_SCALARS = {"int": int, "float": float, "complex": complex, "fraction": Fraction,
            "decimal": Decimal}
_SEQUENCES = {"list": list, "tuple": tuple, "set": set, "frozenset": frozenset}


def decode(doc: Any, depth: int = 0) -> Any:
    """The plain value an encoded document stands for; ``ValueError`` if malformed."""
    if depth > DEPTH:
        raise ValueError("nested too deep")
    if doc is None or isinstance(doc, bool):
        return doc
    if not (isinstance(doc, list) and len(doc) == 2 and isinstance(doc[0], str)):
        raise ValueError(f"not an encoded value: {str(doc)[:80]}")
    tag, body = doc
    if tag in _SCALARS and isinstance(body, str) and len(body) <= 5000:
        return _SCALARS[tag](body)
    if tag == "str" and isinstance(body, str):
        return body
    if tag == "bytes" and isinstance(body, str):
        return bytes.fromhex(body)
    if tag in _SEQUENCES and isinstance(body, list):
        return _SEQUENCES[tag](decode(x, depth + 1) for x in body)
    if tag == "dict" and isinstance(body, list):
        return {decode(k, depth + 1): decode(v, depth + 1) for k, v in body}
    raise ValueError(f"not an encoded value: tag {tag[:40]!r}")


def source(value: Any, depth: int = 0) -> str:
    """``value`` as Python source that rebuilds it in the sandbox; ``ValueError`` for a
    value that has none."""
    if depth > DEPTH:
        raise ValueError("nested too deep")
    if value is None or isinstance(value, (bool, int, str, bytes)):
        return repr(value)
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else f"float({str(value)!r})"
    if isinstance(value, complex):
        return f"complex({source(value.real)}, {source(value.imag)})"
    if isinstance(value, Fraction):
        return f"__import__('fractions').Fraction({value.numerator}, {value.denominator})"
    if isinstance(value, (tuple, list, set, frozenset)):
        items = ", ".join(source(x, depth + 1) for x in value)
        if isinstance(value, tuple):
            return f"({items}{',' if len(value) == 1 else ''})"
        return f"[{items}]" if isinstance(value, list) else f"{type(value).__name__}([{items}])"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{source(k, depth + 1)}: {source(v, depth + 1)}"
                               for k, v in value.items()) + "}"
    if isinstance(value, range):
        return f"range({value.start}, {value.stop}, {value.step})"
    raise ValueError(f"a {type(value).__name__} value cannot be sent into the sandbox")
