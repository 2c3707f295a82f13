"""Code named by import path (``module:name``) in a config: a scorer function, an error
counter. In a run's own process the config is the user's, so any reference resolves. An
engine worker runs configs that arrive over the network, so it resolves only the
references it was started with (``gfcr engine-worker --allow-ref``, and names in the
modules it imports with ``--import``): a call naming ``builtins:exec`` is refused
(:func:`allow`, :func:`check`)."""

from __future__ import annotations

import importlib
import re
from typing import Any, Iterable

REF = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")
FIELDS = ("ref", "scorer", "errors", "agent")
"""Config fields that may hold a reference (Function.ref, Verify.scorer, RoCFilter.errors,
AgentEnv.agent)."""

_ALLOWED: tuple[frozenset[str], frozenset[str]] | None = None
"""(references, modules) this process may resolve; None: any (a run's own process)."""


class RefRefused(PermissionError):
    """A reference this process was not allowed to resolve."""

    gfcr_retry = False  # every worker started the same way refuses it again


def allow(refs: Iterable[str], modules: Iterable[str] = ()) -> None:
    """From now on resolve only ``refs`` and the public names of ``modules``."""
    global _ALLOWED
    _ALLOWED = (frozenset(refs), frozenset(modules))


def allowed(ref: str) -> bool:
    if _ALLOWED is None:
        return True
    refs, modules = _ALLOWED
    module, _, name = ref.partition(":")
    return ref in refs or (module in modules and not name.startswith("_"))


def check(ref: str, what: str) -> None:
    """RefRefused when this process may not resolve ``ref``."""
    if not allowed(ref):
        raise RefRefused(f"{what} {ref!r} is not on this engine worker's list of code it "
                         "runs by import path: start it with `--allow-ref "
                         f"{ref}` (or `--import` its module) if the runs may name it")


def resolve(ref: str, what: str) -> Any:
    """The object ``ref`` (``module:name``) names, if this process may resolve it;
    ValueError naming ``what`` when it cannot be imported."""
    check(ref, what)
    module, _, name = ref.partition(":")
    try:
        # getattr: a 'module:name' the config names, on this process's list (check)
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"cannot import {what} {ref!r}: {err}") from None


def named_in(config: object) -> list[str]:
    """The references a config (a model_dump) names in its reference fields."""
    found: list[str] = []
    if isinstance(config, dict):
        for key, value in config.items():
            if key in FIELDS and isinstance(value, str) and REF.fullmatch(value):
                found.append(value)
            else:
                found.extend(named_in(value))
    elif isinstance(config, (list, tuple)):
        for value in config:
            found.extend(named_in(value))
    return found
