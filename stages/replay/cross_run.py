"""Cross-run replay: add rollouts of other runs, from another store, to each batch.

SAPO (Swarm sAmpling Policy Optimization; "Sharing is Caring: Efficient LM Post-Training
with Collective RL Experience Sharing", Gensyn 2025): each node trains on its own
rollouts plus rollouts other nodes shared, so a success found by one policy propagates.
Here the "network" is any rollout store: the step's context opens the store folder
``source`` read-only (``StepContext.other_store``, once per process) and each step picks
``groups`` groups among those with a complete, scored row that meets the typed row
filter ``match`` (gfcr.core.row_filter.RowFilter; the store evaluates it), and appends all
their complete, scored rows (whole groups: GRPO's baseline needs them) as replayed rows. Rows of the current run are
never taken (that is :class:`~stages.replay.rollout_replay.RolloutReplay`). Lineage is
kept: ``parent_id`` is the source rollout, and the declared extra column
``replay_source`` names the source store and run (``"<store uri>#<run id>"``).

Pin ``as_of_snapshot`` (a DuckLake snapshot id of the source store) to make the choice
reproducible while the source keeps growing; without it the source is read live, and a
resumed run may draw other groups than the original run did.

Departures: shared rollouts keep their token ids and behaviour logprobs (the paper's
nodes exchange text and re-tokenise); the train stage's ratio is then taken against the
source policy, which assumes the same tokenizer. Rewards are the source's.

>>> CrossRunReplay(source=".gfcr/store", match={"kept": True, "reward_above": 0.0}, groups=2)  # doctest: +ELLIPSIS
CrossRunReplay(name=None, type='cross_run_replay', source='.gfcr/store', ...)
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import numpy as np
import pyarrow as pa
from pydantic import Field, model_validator

from gfcr.core import storage
from gfcr.core.rollout import col
from gfcr.core.row_filter import ASCENDING, RowFilter
from gfcr.core.stage import StageSpec, StepContext
from gfcr.core.registry import register
from gfcr.core.storage import History
from stages.replay import _copies, _reads

SOURCE_COLUMN = "replay_source"
"""Declared extra column: ``<store uri>#<run id>`` of each cross-run replayed row."""

LEGACY_WHERE: dict[str, dict[str, Any]] = {
    "true": {}, "kept": {"kept": True}, "not kept": {"kept": False},
    "kept and reward > 0": {"kept": True, "reward_above": 0.0},
}
"""The SQL conditions ``where`` took in shipped pipelines and tests, lower-cased, as
``match`` filters (so a stored spec that used one still loads and resumes)."""


@register("replay")
class CrossRunReplay(StageSpec):
    """Append ``groups`` groups of other runs' rollouts from store ``source`` each step."""

    type: Literal["cross_run_replay"] = "cross_run_replay"
    source: str
    """Store folder to replay from (opened read-only)."""
    match: RowFilter = RowFilter(kept=True)
    """Which rows make a group a candidate (a typed filter, gfcr.core.row_filter.RowFilter):
    a group with a complete, scored row that meets it, e.g. ``{kept: true,
    reward_above: 0}`` (groups the source kept, with a success). Its ``status`` and
    ``scored`` are the stage's own (complete, scored); the reading run is always excluded."""
    groups: int = Field(4, ge=1)
    """Groups added to each step's batch."""
    as_of_snapshot: int | None = Field(None, ge=0)
    """Read the source as of this snapshot (None: live)."""

    writes: ClassVar[frozenset[str]] = frozenset({col.PARENT_ID, col.REPLAY_COUNT, SOURCE_COLUMN})

    @model_validator(mode="before")
    @classmethod
    def _legacy_where(cls, data: Any) -> Any:
        """A spec stored before ``match`` (a run to resume) gave a SQL condition ``where``;
        the conditions gfcr shipped become their filter, any other is refused."""
        if not isinstance(data, dict) or "where" not in data:
            return data
        out = dict(data)
        where = out.pop("where")
        if "match" in out:
            raise ValueError("give 'match' (a typed row filter), not 'where' besides it")
        key = " ".join(str(where).split()).lower() if isinstance(where, str) else None
        if key not in LEGACY_WHERE:
            raise ValueError(f"where {where!r} is a SQL condition, which cross_run_replay no "
                             f"longer takes: give 'match', a row filter (fields of "
                             f"gfcr.core.row_filter.RowFilter, e.g. {{kept: true, reward_above: 0}})")
        out["match"] = RowFilter(**LEGACY_WHERE[key])
        return out

    def augment(self, ctx: StepContext, batch: pa.Table) -> pa.Table:
        source = self.history(ctx)
        scored = RowFilter(status=("complete",), scored=True,
                           exclude_runs=tuple(dict.fromkeys((ctx.run_id, *self.match.exclude_runs))))
        found = source.rows(self.match.where(**scored.model_dump(exclude_defaults=True)),
                            columns=[col.RUN_ID, col.GROUP_ID])
        keys = found.group_by([col.RUN_ID, col.GROUP_ID], use_threads=False).aggregate([]) \
            .sort_by([(col.RUN_ID, "ascending"), (col.GROUP_ID, "ascending")])
        if keys.num_rows == 0:
            return batch
        take = ctx.rng(self.label).choice(keys.num_rows, size=min(self.groups, keys.num_rows),
                                          replace=False)
        picked = keys.take(pa.array(np.sort(take), pa.int64()))
        wanted = tuple(zip(picked.column(col.RUN_ID).to_pylist(), picked.column(col.GROUP_ID).to_pylist()))
        rows = source.rows(scored.where(groups=wanted),
                           order_by=((col.RUN_ID, ASCENDING), (col.GROUP_ID, ASCENDING),
                                     (col.SAMPLE_IDX, ASCENDING)))
        chosen = _reads.as_rollouts(rows)
        origin = [f"{source.uri}#{r}" for r in chosen.column(col.RUN_ID).to_pylist()]
        counts = (chosen.column(col.REPLAY_COUNT).to_numpy() + 1).tolist()
        replayed = _copies.copies(ctx, chosen, counts, tag=self.label, extra={SOURCE_COLUMN: origin})
        return _copies.append(batch, replayed)

    def history(self, ctx: StepContext) -> History:
        """The source store as of ``as_of_snapshot``, read-only, from the context (which
        opens it once per process: the spec holds no open resource)."""
        try:
            return ctx.other_store(self.source, as_of_snapshot=self.as_of_snapshot)
        except storage.backend().errors as err:
            raise ValueError(f"stage {self.label!r}: field 'source' = {self.source!r} is not "
                             f"a readable rollout store: {err}") from err
