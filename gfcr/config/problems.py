"""Every problem of a Python pipeline file at once, and repeated errors counted once.

A YAML pipeline is validated as a whole, so all its problems come in one message. A
Python file builds its stages one constructor call at a time, and the first invalid one
would stop the file. While :func:`collecting` is active (``gfcr.core.loading.load`` turns it
on around a ``.py`` file), a config whose validation fails records its problems, named
by file and line, and stands in as an unvalidated placeholder, so the file runs on and
``Pipeline(...)`` reports these together with its own checks in one
:class:`~gfcr.core.pipeline.PipelineError`. Outside a collection nothing changes: an invalid
config raises at once.
"""

from __future__ import annotations

import reprlib
import sys
from collections import Counter
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any, Iterable, Iterator

from pydantic import BaseModel, ValidationError

from gfcr.config import yamlfile


@dataclass
class Collection:
    """Problems found so far in the file at ``path``."""

    path: str
    problems: list[str] = field(default_factory=list)

    def take(self) -> list[str]:
        """The problems recorded so far, handed over once (Pipeline(...) reports them)."""
        out, self.problems = self.problems, []
        return out


_ACTIVE: ContextVar[Collection | None] = ContextVar("gfcr_collection", default=None)


@contextmanager
def collecting(path: str | Path) -> Iterator[Collection]:
    """Collect config validation problems raised while the file at ``path`` runs."""
    collection = Collection(str(Path(path).resolve()))
    token = _ACTIVE.set(collection)
    try:
        yield collection
    finally:
        _ACTIVE.reset(token)


def active() -> Collection | None:
    return _ACTIVE.get()


def defer(model: BaseModel, data: dict[str, Any], err: ValidationError) -> bool:
    """Inside a collection: record ``err`` of ``type(model)(**data)`` and make ``model`` an
    unvalidated placeholder (True). Outside one: False (the caller raises)."""
    collection = _ACTIVE.get()
    if collection is None:
        return False
    cls = type(model)
    where = _caller_line(collection.path)
    label = data.get("name") or cls.__name__
    for problem in format_errors(err):
        collection.problems.append(f"{where}{label}: {problem}")
    placeholder = cls.model_construct(**{k: v for k, v in data.items() if k in cls.model_fields})
    for attr in ("__dict__", "__pydantic_fields_set__", "__pydantic_extra__",
                 "__pydantic_private__"):
        # getattr: pydantic's own storage slots, copied by name onto the unvalidated model
        object.__setattr__(model, attr, getattr(placeholder, attr))
    return True


def format_errors(err: ValidationError, path: tuple[object, ...] = ()) -> list[str]:
    """One line per pydantic error: ``field 'x': message (got value)``; in a YAML
    pipeline being built (gfcr.config.yamlfile.lines), ``field 'x' at file:line: ...``, where
    ``path`` is the validated value's own place in the file."""
    out = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"])
        line = yamlfile.where(path + tuple(e["loc"]))
        where = f"field {loc!r}{f' at {line}' if line else ''}: " if loc else ""
        got = f" (got {_short(e['input'])})" if e["type"] != "missing" else ""
        out.append(f"{where}{e['msg']}{got}")
    return out


def _short(value: object, limit: int = 200) -> str:
    """``repr(value)`` cut to ``limit`` characters, built without walking a huge value."""
    if isinstance(value, int) and abs(value) >= 10**15:
        return f"an integer of about {int(value.bit_length() * 0.30103) + 1} digits"
    if isinstance(value, (dict, list, tuple, set)) and len(value) > 20:
        return f"<{type(value).__name__} of {len(value)} items>"
    text = reprlib.repr(value) if isinstance(value, (dict, list, tuple, set)) else repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _caller_line(path: str) -> str:
    """``file.py:LINE: `` of the innermost frame running the collected file."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_filename == path:
            return f"{Path(path).name}:{frame.f_lineno}: "
        frame = frame.f_back
    return ""


def located(err: BaseException, path: str) -> str:
    """An exception raised while the file at ``path`` ran, as one line naming its line."""
    if isinstance(err, SyntaxError):
        return f"{Path(path).name}:{err.lineno}: SyntaxError: {err.msg}"
    line = None
    tb: TracebackType | None = err.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == str(Path(path).resolve()):
            line = tb.tb_lineno
        tb = tb.tb_next
    where = f"{Path(path).name}:{line}: " if line else f"{Path(path).name}: "
    return f"{where}{type(err).__name__}: {err}"


def tally(messages: Iterable[str | None]) -> list[tuple[str, int]]:
    """Distinct non-empty messages with their counts, most frequent first."""
    return Counter(m for m in messages if m).most_common()


def counted(messages: Iterable[str | None]) -> list[str]:
    """Distinct non-empty messages, most frequent first, each once with its count:
    ``"ValueError: bad (12x)"``."""
    return [f"{m} ({n}x)" if n > 1 else m for m, n in tally(messages)]
