"""What a live view of a store reads (``gfcr ui``): typed rollout filters and the named
reads that answer them, as a protocol the store implements (``store.browse``).

gfcr holds no SQL: the UI asks for rows with a :class:`RolloutQuery` (every value bound by
the store, never spliced into SQL text) through ``StoreBackend.browse``. Each read runs
read-only at the store's latest committed snapshot, so it never blocks a writer.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, Protocol, Sequence

import pyarrow as pa

PAGE = 50
"""Rollouts per page of the rollouts table."""
MAX_PAGE = 500
"""The most rollouts one page may ask for."""
TEXT_CAP = 500
"""Matches of a free-text filter after which the rollouts page stops scanning older steps
(a substring scan of every text costs ~25 ms a 50,000-row step): its count then reads
"500+" and its histogram covers the newest steps scanned (said on
the page, with a link that counts every step)."""


@dataclass(frozen=True)
class RolloutQuery:
    """Which rollouts of a run to show: each field None means "any". Checked on creation
    (a bad value raises ValueError naming the field and the value)."""

    step: int | None = None
    stage: str | None = None
    """The stage that dropped the row (``dropped_by``)."""
    kept: bool | None = None
    reason: str | None = None
    """Text the drop reason contains."""
    reward_min: float | None = None
    reward_max: float | None = None
    """Inclusive reward range; a bound set excludes unscored rows."""
    len_min: int | None = None
    len_max: int | None = None
    """Inclusive range of ``n_tokens``."""
    server: str | None = None
    """The fleet server that generated the row (the ``server`` column)."""
    version: int | None = None
    """The policy version that sampled the row's first token."""
    q: str | None = None
    """Text the prompt or the completion contains (case-insensitive), or a rollout id."""
    prompt_id: str | None = None
    group_id: str | None = None
    limit: int = PAGE
    offset: int = 0

    def __post_init__(self) -> None:
        for low, high in (("reward_min", "reward_max"), ("len_min", "len_max")):
            a, b = getattr(self, low), getattr(self, high)  # getattr: this dataclass's own fields
            if a is not None and b is not None and a > b:
                raise ValueError(f"{low}={a!r} is above {high}={b!r}")
        if not 1 <= self.limit <= MAX_PAGE:
            raise ValueError(f"limit={self.limit!r} must be between 1 and {MAX_PAGE}")
        if self.offset < 0:
            raise ValueError(f"offset={self.offset!r} must not be negative")
        for name in ("step", "len_min", "len_max", "version"):
            value = getattr(self, name)  # getattr: this dataclass's own fields
            if value is not None and not -2**62 < value < 2**62:
                raise ValueError(f"{name}={value!r} is out of range")

    def without(self, *names: str) -> RolloutQuery:
        """This query with the fields ``names`` reset to None (e.g. the histogram's own
        reward range)."""
        changes: dict[str, Any] = {name: None for name in names}
        return replace(self, **changes)

    def as_params(self) -> dict[str, str]:
        """The query as URL parameters (fields at their default left out)."""
        default = RolloutQuery()
        out: dict[str, str] = {}
        for f in fields(self):
            value = getattr(self, f.name)  # getattr: this dataclass's own fields
            if value is not None and value != getattr(default, f.name):
                out[f.name] = str(value).lower() if isinstance(value, bool) else str(value)
        return out


@dataclass(frozen=True)
class RolloutPage:
    """One page of a run's rollouts with the count and reward histogram of all that match.

    ``complete`` False: a free-text filter stopped at ``TEXT_CAP`` matches, so ``total``
    is a lower bound and ``bars`` count the matches in steps ``steps[0]``..``steps[1]``
    (the newest), the page's rows being exact all the same (rows go newest step first)."""

    rows: pa.Table
    total: int
    bars: pa.Table
    complete: bool = True
    steps: tuple[int, int] | None = None


class BrowseReads(Protocol):
    """Named, read-only reads a live view makes of a store (``store.browse``)."""

    def runs_overview(self) -> pa.Table:
        """One row per run, newest first: ``run_id``, ``pipeline``, ``status``,
        ``started_at``, ``finished_at``, ``error``, ``steps``, ``last_step``, ``rollouts``,
        ``reward`` (the last step's mean reward metric), ``accuracy`` (the latest held-out
        accuracy), ``rollouts_per_s`` (rollouts over the time between the first and the
        last step's commit)."""
        ...

    def marker(self, run_id: str) -> dict[str, Any] | None:
        """What says a run moved: ``status``, ``last_step``, ``steps``, ``error`` (None:
        no such run). Cheap: read every half second by the live view."""
        ...

    def rollouts(self, run_id: str, query: RolloutQuery) -> pa.Table:
        """One page of the run's rollouts that meet ``query``, by step (newest first),
        group and sample, with short texts."""
        ...

    def histogram(self, run_id: str, query: RolloutQuery, bins: int) -> tuple[int, pa.Table]:
        """How many rollouts meet ``query``, and ``bins`` equal reward bins over the scored
        rows that meet it with its reward range aside (``bin``, ``low``, ``high``, ``n``;
        empty bins left out), in one scan."""
        ...

    def page(self, run_id: str, query: RolloutQuery, bins: int, cap: int | None = TEXT_CAP) -> RolloutPage:
        """:meth:`rollouts` and :meth:`histogram` of one page. A free-text filter over
        every step scans the newest steps first, narrow columns beside the texts, and
        stops past ``cap`` matches (None: every step); the page's wide columns are then
        read for its rows only."""
        ...

    def rollout(self, run_id: str, rollout_id: str) -> dict[str, Any] | None:
        """Every stored column of one rollout (its ``turns`` derived for a row stored
        before turns existed), or None."""
        ...

    def children(self, run_id: str, rollout_id: str) -> pa.Table:
        """Rows continued or branched from ``rollout_id`` (``parent_id``): ``run_id``,
        ``step``, ``rollout_id``, ``reward``, ``kept``."""
        ...

    def prompt_rows(self, prompt_id: str, run_ids: Sequence[str], limit: int) -> pa.Table:
        """Up to ``limit`` rows of one prompt in ``run_ids``, by run and step."""
        ...

    def drop_reasons(self, run_id: str) -> pa.Table:
        """The run's (``dropped_by``, ``reason``, ``n``) over all steps, commonest first."""
        ...

    def columns(self) -> list[str]:
        """The columns of the store's ``rollouts`` table."""
        ...

    def eval_completions(self, run_id: str, eval_set: str, labels: Sequence[str]) -> pa.Table:
        """The greedy completions (``sample`` 0 at temperature 0) of the run's evaluations
        ``labels`` (every evaluation when empty) on ``eval_set``: ``label``, ``prompt_id``, ``prompt``, ``answer``,
        ``completion``, ``n_tokens``, ``reward``, ``correct``, ``error``; empty on a store
        that keeps none (written before schema version 3)."""
        ...
