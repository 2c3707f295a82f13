"""The base of every config (stages, components, pipeline settings): strict, immutable,
and holding only finite, bounded numbers.

Every number a config holds is checked when it is built, whatever its field, so a value
that would only fail deep inside a run (``lr=inf`` turning the weights into NaN, a size of
``10**40`` overflowing a C integer after the model is built) is refused naming its field:

- a float must be finite (no nan or inf, also inside lists and mappings);
- a float field without its own upper (lower) bound is at most :data:`FLOAT_LIMIT` (at
  least ``-FLOAT_LIMIT``); an int field likewise within :data:`INT_LIMIT`, the largest C
  ``int``, which is what threads, sizes and token counts become in torch and numpy. A
  field declaring ``le``/``lt`` (``ge``/``gt``) keeps its own bound on that side;
- an int inside a list or mapping (a task's ``config``, say) fits a signed 64-bit integer.
"""

from __future__ import annotations

import math
from typing import ClassVar

import annotated_types as at
from pydantic import BaseModel, ConfigDict, ValidationError, ValidationInfo, field_validator

from gfcr.config import problems

FLOAT_LIMIT = 1e9
"""Largest magnitude of a float field with no bound of its own (a timeout of 30 years)."""
INT_LIMIT = 2**31 - 1
"""Largest magnitude of an int field with no bound of its own (a C int)."""
NESTED_INT_LIMIT = 2**63 - 1
"""Largest magnitude of an int inside a list or mapping (an int64)."""


class Spec(BaseModel):
    """Base of every config: strict (unknown fields are errors), immutable and bounded
    (see the module). A field's description is its attribute docstring (``gfcr stages
    TYPE`` lists them)."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True,
                              use_attribute_docstrings=True, allow_inf_nan=False)

    def __init__(self, **data: object) -> None:
        try:
            super().__init__(**data)
        except ValidationError as err:
            if not problems.defer(self, data, err):  # a .py pipeline being loaded
                raise

    nested_numbers: ClassVar[bool] = True
    """Whether numbers inside list and mapping fields are checked (see the module)."""

    @field_validator("*", mode="after")
    @classmethod
    def _bounded_numbers(cls, value: object, info: ValidationInfo) -> object:
        field = cls.model_fields.get(info.field_name or "")
        low, high = _own_bounds(field.metadata if field is not None else [])
        problem = _out_of_range(value, low, high) or (
            _nested_problem(value) if cls.nested_numbers else None)
        if problem:
            raise ValueError(problem)
        return value


def _own_bounds(metadata: list[object]) -> tuple[bool, bool]:
    """Whether a field declares its own lower and upper bound."""
    low = any(isinstance(m, (at.Ge, at.Gt)) for m in metadata)
    high = any(isinstance(m, (at.Le, at.Lt)) for m in metadata)
    return low, high


def _out_of_range(value: object, own_low: bool, own_high: bool) -> str | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return f"must be a finite number, got {value!r}"
    limit, shown = (INT_LIMIT, str(INT_LIMIT)) if isinstance(value, int) else (
        FLOAT_LIMIT, f"{FLOAT_LIMIT:g}")
    if value > limit and not own_high:
        return f"must be at most {shown} (a larger value is no sensible setting)"
    if value < -limit and not own_low:
        return f"must be at least -{shown} (a smaller value is no sensible setting)"
    return None


def _nested_problem(value: object) -> str | None:
    """The first non-finite float or over-large int inside lists, tuples and mappings."""
    todo: list[object] = [value] if isinstance(value, (list, tuple, dict, set, frozenset)) else []
    while todo:
        item = todo.pop()
        if isinstance(item, dict):
            todo.extend(item.values())
        elif isinstance(item, (list, tuple, set, frozenset)):
            todo.extend(item)
        elif isinstance(item, float) and not math.isfinite(item):
            return f"must hold only finite numbers; found {item!r}"
        elif isinstance(item, int) and not isinstance(item, bool) and (
                abs(item) > NESTED_INT_LIMIT):
            return ("must hold only integers within +-(2**63 - 1); found one of "
                    f"{item.bit_length()} bits")
    return None

