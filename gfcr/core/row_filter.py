"""Which stored rollouts a read wants, as typed conditions: :class:`RowFilter`.

Stages read the store's rows through ``History.rows(filter, columns=...)``
(gfcr.core.storage) and aggregate them themselves, in Arrow. The filter is data, not SQL: the
store builds its query from the fields, binds the values as parameters, and pushes the
conditions and the column projection down to the scan, so a stage neither writes SQL nor
reads rows it then throws away. Each field left at None (or empty) does not restrict; the
set ones all hold (AND).

An *attempt* (what ``store.views``' ``prompt_history`` counts) is a complete, scored,
original rollout: :data:`ATTEMPTS`, or ``RowFilter.attempts(...)`` with more conditions.

>>> RowFilter(step_min=3, kept=True).step_min
3
>>> RowFilter(step_min=4, step_max=2)  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
pydantic_core._pydantic_core.ValidationError: 1 validation error for RowFilter
...step_min 4 is after step_max 2...
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

STATUSES = ("complete", "partial", "pruned")
"""The values of ``rollouts.status`` (gfcr.core.rollout)."""

Ids = tuple[str, ...]


class RowFilter(BaseModel):
    """Conditions on ``rollouts`` rows; every field that is set must hold."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    run_ids: Ids | None = None
    """Only these runs. None: the history's own run (every run when it has none)."""
    exclude_runs: Ids = ()
    """Never these runs (cross-run reads leave the reading run out)."""
    step_min: int | None = Field(None, ge=0)
    """Steps from this one on (inclusive)."""
    step_max: int | None = Field(None, ge=0)
    """Steps up to this one (inclusive)."""
    status: tuple[str, ...] | None = None
    """Only rows with one of these statuses (``STATUSES``)."""
    kept: bool | None = None
    """Rows the filters kept (True) or dropped (False)."""
    scored: bool | None = None
    """Rows with a reward (True) or without one (False)."""
    replayed: bool | None = None
    """Replayed copies (``replay_count > 0``: True) or original rows (False)."""
    consumed: bool | None = None
    """Rows an update trained on (``consumed_at_step`` set: True) or not (False)."""
    reward_above: float | None = None
    """Rows whose reward is greater than this (unscored rows never are)."""
    prompt_ids: Ids | None = None
    """Only rows of these prompts."""
    tasks: Ids | None = None
    """Only rows of these tasks."""
    parent_ids: Ids | None = None
    """Only rows whose ``parent_id`` is one of these (the children of those rollouts)."""
    groups: tuple[tuple[str, str], ...] | None = None
    """Only rows of these (run id, group id) groups."""

    @model_validator(mode="before")
    @classmethod
    def _tuples(cls, data: object) -> object:
        """Lists become tuples (strict mode refuses them otherwise); a lone string where
        ids are wanted is refused, naming the field (it would read as its characters)."""
        if not isinstance(data, dict):
            return data
        out = dict(data)
        for name in ("run_ids", "exclude_runs", "status", "prompt_ids", "tasks", "parent_ids"):
            value = out.get(name)
            if isinstance(value, str):
                raise ValueError(f"{name} must be a sequence of strings, not the string {value!r}")
            if isinstance(value, list):
                out[name] = tuple(value)
        if isinstance(out.get("groups"), list):
            out["groups"] = tuple(tuple(g) if isinstance(g, list) else g for g in out["groups"])
        return out

    @model_validator(mode="after")
    def _consistent(self) -> RowFilter:
        if self.step_min is not None and self.step_max is not None and self.step_min > self.step_max:
            raise ValueError(f"step_min {self.step_min} is after step_max {self.step_max}: "
                             "no step is in that range")
        for value in self.status or ():
            if value not in STATUSES:
                raise ValueError(f"status {value!r} is not one of {', '.join(STATUSES)}")
        return self

    @classmethod
    def attempts(cls, **conditions: Any) -> RowFilter:
        """Complete, scored, original rows (an *attempt*), with further ``conditions``."""
        return cls(status=("complete",), scored=True, replayed=False, **conditions)

    def where(self, **changes: Any) -> RowFilter:
        """This filter with ``changes`` (validated like the constructor's fields)."""
        return RowFilter(**{**self.model_dump(exclude_unset=True), **changes})


EVERY_ROW = RowFilter()
"""No condition: every row (of the history's run, when it has one)."""

ATTEMPTS = RowFilter.attempts()
"""Every attempt: complete, scored, original rows."""

ASCENDING, DESCENDING = "ascending", "descending"
Order = tuple[tuple[str, str], ...]
"""``(column, "ascending" | "descending")`` pairs, as ``pyarrow.Table.sort_by`` takes them."""
