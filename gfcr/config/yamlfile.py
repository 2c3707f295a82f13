"""Reading YAML that a person wrote (pipeline files, ``--filter`` files, ``--set`` values),
bounded so that bad input is refused at once, naming the file and line.

:func:`load` refuses, with :class:`YamlRefused` (``file:line:column: what``):

- a text over :data:`MAX_BYTES`;
- a document whose values, with every alias expanded, number over :data:`MAX_VALUES`
  (an "alias bomb": a few hundred bytes of nested aliases that expand to billions of
  values), or whose aliases refer to themselves;
- nesting deeper than :data:`MAX_DEPTH`;
- a mapping that gives one key twice (YAML says keys are unique; PyYAML would keep the
  last one silently); merge keys (``<<: *base``) may still be overridden;
- any syntax error, located in the file rather than ``<unicode string>``.

The checks run on the composed node graph, where an alias is one shared node, so they cost
time in proportion to the text, not to what the aliases expand to. The parser is libyaml's
where it is installed (it has its own nesting limit; the pure-Python one recurses).

While :func:`lines` is active, :func:`where` tells the ``file:line`` of a value by its
path (``("stages", 4, "lr")``), so that config errors name their line (gfcr.config.problems).
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Iterator

import yaml

MAX_BYTES = 1 << 20
"""Largest YAML text read (1 MiB; a pipeline is a few KB)."""
MAX_VALUES = 100_000
"""Most values (mappings, sequences, scalars) a document may hold with its aliases expanded."""
MAX_DEPTH = 64
"""Deepest nesting of mappings and sequences (a pipeline nests fewer than 10 levels)."""

_TOO_LARGE = f"the text is larger than {MAX_BYTES} bytes (a pipeline is a few KB)"
_BaseLoader: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_MERGE = "tag:yaml.org,2002:merge"
_INT = "tag:yaml.org,2002:int"
MAX_DIGITS = 64
"""Longest integer read (a YAML integer of thousands of digits costs seconds to convert)."""


class YamlRefused(ValueError):
    """YAML that was not read; ``problem`` says why, the message adds where."""

    def __init__(self, where: str, problem: str, mark: yaml.Mark | None = None) -> None:
        self.problem = problem
        at = f"{where}:{mark.line + 1}:{mark.column + 1}" if mark is not None else where
        super().__init__(f"{at}: {problem}")


class _Loader(_BaseLoader):
    """The safe loader, refusing a key given twice in one mapping."""

    def construct_mapping(self, node: yaml.Node, deep: bool = False) -> dict[object, object]:
        if isinstance(node, yaml.MappingNode):
            _no_duplicates(self, node)
        return super().construct_mapping(node, deep=deep)


def _no_duplicates(loader: _Loader, node: yaml.MappingNode) -> None:
    seen: dict[object, int] = {}
    for key_node, _ in node.value:
        if key_node.tag == _MERGE:
            continue
        key = loader.construct_object(key_node, deep=True)
        try:
            first = seen.get(key)
        except TypeError:  # an unhashable key: the constructor reports it
            continue
        if first is not None:
            raise yaml.MarkedYAMLError(
                None, None,
                f"key {key!r} is given twice (first on line {first}); a key may appear once "
                "in a mapping", key_node.start_mark)
        seen[key] = key_node.start_mark.line + 1


def load(text: str, *, where: str = "YAML") -> Any:
    """The data of one YAML document, or :class:`YamlRefused` naming ``where`` and the line."""
    return _load(text, where)[0]


def _load(text: str, where: str) -> tuple[Any, yaml.Node | None]:
    if len(text) > MAX_BYTES or len(text.encode("utf-8", "surrogatepass")) > MAX_BYTES:
        raise YamlRefused(where, _TOO_LARGE)
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None, None
        _measure(node, where)
        return loader.construct_document(node), node
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        what = "; ".join(p for p in (err.problem, err.context) if p) or type(err).__name__
        raise YamlRefused(where, what, mark) from None
    except yaml.YAMLError as err:
        raise YamlRefused(where, f"{type(err).__name__}: {err}") from None
    except YamlRefused:
        raise
    except ValueError as err:  # e.g. an integer of more digits than Python converts
        raise YamlRefused(where, f"a value cannot be read ({err})") from None
    except RecursionError:
        raise YamlRefused(where, f"the values nest more than {MAX_DEPTH} levels deep") from None
    finally:
        loader.dispose()


def read(path: str | Path, *, where: str | None = None) -> Any:
    """:func:`load` of the file at ``path``."""
    return load(read_text(path, where=where), where=where or str(path))


def read_text(path: str | Path, *, where: str | None = None) -> str:
    """The text of the YAML file at ``path``, refused before reading when it is too large."""
    path = Path(path)
    label = where or str(path)
    if path.stat().st_size > MAX_BYTES:
        raise YamlRefused(label, _TOO_LARGE)
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise YamlRefused(label, f"the file is not UTF-8 text (byte {err.start})") from None


def _scalar_problem(node: yaml.Node) -> str | None:
    if node.tag == _INT and len(node.value) > MAX_DIGITS:
        return (f"an integer of {len(node.value)} characters; no setting is larger than "
                f"{MAX_DIGITS} digits")
    return None


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _measure(root: yaml.Node, where: str) -> None:
    """Refuse a graph that expands to over MAX_VALUES values, nests over MAX_DEPTH levels
    or holds a recursive alias. Iterative, each shared (aliased) node measured once."""
    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    open_: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            open_.discard(key)
            kids = _children(node)
            size[key] = 1 + sum(size[id(k)] for k in kids)
            depth[key] = 1 + max((depth[id(k)] for k in kids), default=0)
            if size[key] > MAX_VALUES:
                raise YamlRefused(where, f"the aliases expand to more than {MAX_VALUES} "
                                  "values; write the values out", node.start_mark)
            if depth[key] > MAX_DEPTH:
                raise YamlRefused(where, f"the values nest more than {MAX_DEPTH} levels deep",
                                  node.start_mark)
            continue
        if key in size:
            continue
        problem = _scalar_problem(node)
        if problem:
            raise YamlRefused(where, problem, node.start_mark)
        if key in open_:
            raise YamlRefused(where, "an alias refers to a value that contains it",
                              node.start_mark)
        open_.add(key)
        stack.append((node, True))
        stack.extend((k, False) for k in _children(node) if id(k) not in size)


# --------------------------------------------------------------------------- lines

_LINES: ContextVar[tuple[str, dict[tuple[object, ...], int]] | None] = ContextVar(
    "gfcr_yaml_lines", default=None)


def load_with_lines(text: str, *, where: str) -> tuple[Any, dict[tuple[object, ...], int]]:
    """:func:`load`, and the line of each mapping key and sequence item by its path."""
    data, node = _load(text, where)
    out: dict[tuple[object, ...], int] = {}
    todo: list[tuple[tuple[object, ...], yaml.Node | None]] = [((), node)]
    while todo:
        path, n = todo.pop()
        if isinstance(n, yaml.MappingNode):
            for k, v in n.value:
                if isinstance(k, yaml.ScalarNode) and k.tag != _MERGE:
                    out[path + (k.value,)] = k.start_mark.line + 1
                    todo.append((path + (k.value,), v))
        elif isinstance(n, yaml.SequenceNode):
            for i, v in enumerate(n.value):
                out[path + (i,)] = v.start_mark.line + 1
                todo.append((path + (i,), v))
    return data, out


@contextmanager
def lines(where: str, table: dict[tuple[object, ...], int]) -> Iterator[None]:
    """Make :func:`where` answer from ``table`` (``load_with_lines``) of the file ``where``."""
    token = _LINES.set((where, table))
    try:
        yield
    finally:
        _LINES.reset(token)


def where(path: tuple[object, ...]) -> str | None:
    """``file:line`` of the value at ``path`` (or of its nearest enclosing one) in the YAML
    being built, or None outside :func:`lines`."""
    active = _LINES.get()
    if active is None:
        return None
    name, table = active
    for end in range(len(path), 0, -1):
        line = table.get(tuple(path[:end]))
        if line is not None:
            return f"{name}:{line}"
    return None
