"""A page's URL parameters read into typed values, with an error naming the parameter and
its value when one is malformed (``?step=abc``: "step='abc' is not a whole number")."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import fields

from gfcr.core.browse import RolloutQuery
from gfcr.ui.context import UiError

_INTS = frozenset({"step", "len_min", "len_max", "version", "limit", "offset"})
_FLOATS = frozenset({"reward_min", "reward_max"})
_BOOLS = {"true": True, "1": True, "kept": True, "false": False, "0": False, "dropped": False}


def rollout_query(params: Mapping[str, str]) -> RolloutQuery:
    """The :class:`RolloutQuery` of a page's parameters (empty ones ignored; others
    than its fields, e.g. ``token``, ignored); UiError 400 naming a bad one."""
    values: dict[str, object] = {}
    for f in fields(RolloutQuery):
        raw = params.get(f.name, "").strip()
        if raw:
            values[f.name] = _value(f.name, raw)
    try:
        return RolloutQuery(**values)  # type: ignore[arg-type]
    except ValueError as e:
        raise UiError(400, f"bad filter: {e}") from e


def _value(name: str, raw: str) -> object:
    if name in _INTS:
        try:
            return int(raw)
        except ValueError:
            raise UiError(400, f"bad filter: {name}={raw!r} is not a whole number") from None
    if name in _FLOATS:
        try:
            value = float(raw)
        except ValueError:
            raise UiError(400, f"bad filter: {name}={raw!r} is not a number") from None
        if not math.isfinite(value):
            raise UiError(400, f"bad filter: {name}={raw!r} is not a finite number")
        return value
    if name == "kept":
        if raw.lower() not in _BOOLS:
            raise UiError(400, f"bad filter: kept={raw!r} must be true or false")
        return _BOOLS[raw.lower()]
    if len(raw) > 500:
        raise UiError(400, f"bad filter: {name} is {len(raw)} characters long (at most 500)")
    return raw


def integer(params: Mapping[str, str], name: str, default: int, low: int, high: int) -> int:
    """Parameter ``name`` as a whole number in [low, high] (``default`` when absent)."""
    raw = params.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise UiError(400, f"bad parameter: {name}={raw!r} is not a whole number") from None
    if not low <= value <= high:
        raise UiError(400, f"bad parameter: {name}={value!r} must be between {low} and {high}")
    return value


def run_list(params: Mapping[str, str], name: str = "runs") -> list[str]:
    """Parameter ``name`` as a list of run ids (comma-separated), without repeats."""
    return list(dict.fromkeys(r.strip() for r in params.get(name, "").split(",") if r.strip()))
