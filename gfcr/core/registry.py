"""The one registry every operator and component goes through: :func:`register` files a
config class under its kind and ``type`` name, after checking it defines what its kind
needs (a stage the methods of its phases, :data:`gfcr.core.stage.PHASES`; a component
those of :data:`COMPONENT_METHODS`), and :func:`lookup` finds it again by name, loading
the ``gfcr.plugins`` entry points first, so gfcr never imports an operator library.
"""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Callable, TypeVar

from gfcr.core.spec import Spec
from gfcr.core.stage import PHASES, STAGE_ORDER, Kind

COMPONENT_METHODS: dict[str, tuple[str, ...]] = {
    "task": ("train_prompts", "heldout_prompts", "score"),
    "policy": ("build",),
    "engine": ("build",),
    "warmstart": ("run",),
}
"""What a component class of each kind must define."""

REGISTRY: dict[str, dict[str, type[Spec]]] = {
    kind: {} for kind in (*STAGE_ORDER, *COMPONENT_METHODS)}
"""kind -> type name -> config class. Populated by :func:`register`."""

S = TypeVar("S", bound=type[Spec])


def register(kind: Kind) -> Callable[[S], S]:
    """Class decorator: register a config class under its ``type`` default.

    >>> from typing import Literal
    >>> from gfcr.core.stage import FilterResult, StageSpec
    >>> @register("filter")
    ... class Always(StageSpec):
    ...     type: Literal["always"] = "always"
    ...     def apply(self, ctx, rollouts): return FilterResult(rollouts)
    """
    def decorate(cls: S) -> S:
        name = _type_name(cls)
        missing = _missing_methods(kind, cls)
        if missing:
            raise TypeError(f"{cls.__name__} registered as {kind!r} lacks {missing}")
        if name in REGISTRY[kind] and REGISTRY[kind][name] is not cls:
            raise ValueError(f"{kind} type {name!r} is already registered "
                             f"by {REGISTRY[kind][name].__qualname__}")
        if kind in STAGE_ORDER:
            cls.kind = kind  # type: ignore[attr-defined]
        REGISTRY[kind][name] = cls
        return cls
    return decorate


def _type_name(cls: type[Spec]) -> str:
    field_info = cls.model_fields.get("type")
    if field_info is None or not isinstance(field_info.default, str):
        raise TypeError(f"{cls.__name__} needs a field `type: Literal[...] = '<name>'`")
    return field_info.default


def _missing_methods(kind: str, cls: type) -> list[str]:
    """What ``cls`` lacks to be registered as ``kind`` (see :data:`PHASES`)."""
    if kind in COMPONENT_METHODS:
        return [m for m in COMPONENT_METHODS[kind] if not _defines(cls, m)]
    phases = [p for p in PHASES if p.kind == kind]
    missing = [p.method for p in phases if not p.optional and not _defines(cls, p.method)]
    if not missing and not any(_defines(cls, p.method) for p in phases):
        missing = [" or ".join(p.method for p in phases)]
    return missing


def _defines(cls: type, method: str) -> bool:
    # a class attribute lookup by name is what registration checks: the class is not
    # an instance yet, so the phase protocols cannot be isinstance-checked
    return callable(getattr(cls, method, None))


def lookup(kind: Kind, name: str) -> type[Spec]:
    """The config class registered as ``name`` for ``kind``; KeyError lists the known."""
    load_plugins()
    try:
        return REGISTRY[kind][name]
    except KeyError:
        known = ", ".join(sorted(REGISTRY[kind])) or "none"
        raise KeyError(f"unknown {kind} type {name!r}; known: {known}") from None


_PLUGINS_LOADED = False


def load_plugins() -> None:
    """Import every package named in the ``gfcr.plugins`` entry-point group once.

    This is how operator libraries (``stages`` ships as one) fill the registry without
    gfcr importing them.
    """
    global _PLUGINS_LOADED
    if _PLUGINS_LOADED:
        return
    _PLUGINS_LOADED = True
    for ep in entry_points(group="gfcr.plugins"):
        ep.load()
