"""``gfcr stages``: the registered stage and component types, and their fields.

Everything a pipeline can name is in the registry (:mod:`gfcr.core.stage`), and every field's
description is its attribute docstring, so this reference cannot drift from the code.
"""

from __future__ import annotations

import sys
from types import UnionType
from typing import (TYPE_CHECKING, Annotated, Literal, Optional, Union, get_args,
                    get_origin)

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

if TYPE_CHECKING:
    from pydantic.fields import FieldInfo

    from gfcr.core.stage import Spec

COMPONENTS = ("task", "policy", "engine", "warmstart")
"""Component kinds, listed after the stage kinds (gfcr.core.stage's STAGE_ORDER). gfcr.core.stage is
imported only when ``gfcr stages`` runs, so other commands start without it."""


def kind_order() -> tuple[str, ...]:
    """Stage kinds in pipeline order, then the components."""
    from gfcr.core.stage import STAGE_ORDER

    return (*STAGE_ORDER, *COMPONENTS)


def stages(type_: Optional[str] = typer.Argument(
        None, metavar="[TYPE]", help="A stage or component type: print its fields.")) -> None:
    """List every stage and component type (kind, module, summary), or one type's fields."""
    from gfcr.core.registry import REGISTRY, load_plugins

    load_plugins()
    console = Console() if sys.stdout.isatty() else Console(width=200)
    if type_ is None:
        console.print(overview())
        console.print("`gfcr stages TYPE` lists a type's fields.", highlight=False)
        return
    found = [(kind, REGISTRY[kind][type_]) for kind in kind_order() if type_ in REGISTRY[kind]]
    if not found:
        known = sorted({t for kind in kind_order() for t in REGISTRY[kind]})
        raise typer.BadParameter(f"no stage or component type {type_!r}; known: "
                                 f"{', '.join(known)}", param_hint="TYPE")
    for kind, cls in found:
        console.print(f"[bold]{type_}[/bold] ({kind}, {cls.__module__}.{cls.__name__})")
        console.print(_doc(cls), highlight=False, markup=False, soft_wrap=True)
        console.print(fields(cls))


def overview() -> Table:
    """One row per registered type: type, kind, module and the docstring's first line."""
    from gfcr.core.registry import REGISTRY

    table = Table("type", "kind", "module", "summary", box=None, pad_edge=False)
    for kind in kind_order():
        for name, cls in sorted(REGISTRY[kind].items()):
            table.add_row(*map(escape, (name, kind, cls.__module__, summary(cls))))
    return table


def summary(cls: type) -> str:
    """The first paragraph of ``cls``'s docstring, on one line."""
    return " ".join(_doc(cls).split("\n\n", 1)[0].split())


def fields(cls: type[Spec]) -> Table:
    """Every field of ``cls`` but ``type``: name, type, default, description."""
    table = Table("field", "type", "default", "description", box=None, pad_edge=False)
    for name, info in cls.model_fields.items():
        if name == "type":
            continue
        table.add_row(*map(escape, (name, type_name(info.annotation), default(info),
                                    " ".join((info.description or "").split()))))
    return table


def type_name(annotation: object) -> str:
    """A readable type: ``int``, ``Literal['a', 'b']``, ``str | None``, ``tuple[str, ...]``."""
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Annotated:
        return type_name(args[0])
    if origin in (Union, UnionType):
        return " | ".join(type_name(a) for a in args)
    if origin is Literal:
        return f"Literal[{', '.join(repr(a) for a in args)}]"
    if origin is not None:
        inner = ", ".join("..." if a is Ellipsis else type_name(a) for a in args)
        # getattr: a generic's origin is a class (its name) or a typing special form (none)
        return f"{getattr(origin, '__name__', str(origin))}[{inner}]"
    if annotation is type(None):
        return "None"
    if isinstance(annotation, type):
        return annotation.__name__
    return str(annotation).replace("typing.", "")


def default(info: FieldInfo) -> str:
    from pydantic_core import PydanticUndefined

    if info.default_factory is not None:
        return repr(info.default_factory())  # type: ignore[call-arg]
    if info.default is PydanticUndefined:
        return "(required)"
    return repr(info.default)


def _doc(cls: type) -> str:
    import inspect

    return inspect.cleandoc(cls.__doc__ or "").strip()
