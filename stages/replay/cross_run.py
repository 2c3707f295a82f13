"""Cross-run replay: add rollouts of other runs, from another store, to each batch.

SAPO (Swarm sAmpling Policy Optimization; "Sharing is Caring: Efficient LM Post-Training
with Collective RL Experience Sharing", Gensyn 2025): each node trains on its own
rollouts plus rollouts other nodes shared, so a success found by one policy propagates.
Here the "network" is any rollout store: the step's context opens the store folder
``source`` read-only (``StepContext.other_store``, once per process) and each step picks
``groups`` groups among those with a complete, scored row that satisfies the SQL condition
``where``, and appends all their complete, scored rows (whole groups: GRPO's baseline
needs them) as replayed rows. Rows of the current run are
never taken (that is :class:`~stages.replay.rollout_replay.RolloutReplay`). Lineage is
kept: ``parent_id`` is the source rollout, and the declared extra column
``replay_source`` names the source store and run (``"<store uri>#<run id>"``).

Pin ``as_of_snapshot`` (a DuckLake snapshot id of the source store) to make the choice
reproducible while the source keeps growing; without it the source is read live, and a
resumed run may draw other groups than the original run did.

Departures: shared rollouts keep their token ids and behaviour logprobs (the paper's
nodes exchange text and re-tokenise); the train stage's ratio is then taken against the
source policy, which assumes the same tokenizer. Rewards are the source's.

>>> CrossRunReplay(source=".gfcr/store", where="kept AND reward > 0", groups=2)  # doctest: +ELLIPSIS
CrossRunReplay(name=None, type='cross_run_replay', source='.gfcr/store', ...)
"""

from __future__ import annotations

from typing import ClassVar, Literal

import duckdb
import numpy as np
import pyarrow as pa
from pydantic import Field, field_validator

from gfcr import storage
from gfcr.rollout import col
from gfcr.stage import StageSpec, StepContext, register
from gfcr.storage import History
from stages.replay import _copies, _reads

SOURCE_COLUMN = "replay_source"
"""Declared extra column: ``<store uri>#<run id>`` of each cross-run replayed row."""


@register("replay")
class CrossRunReplay(StageSpec):
    """Append ``groups`` groups of other runs' rollouts from store ``source`` each step."""

    type: Literal["cross_run_replay"] = "cross_run_replay"
    source: str
    """Store folder to replay from (opened read-only)."""
    where: str = "kept"
    """SQL condition on the source's ``rollouts`` rows; a group with a row that meets it
    is a candidate, e.g. "kept AND reward > 0" (groups with a success and signal)."""
    groups: int = Field(4, ge=1)
    """Groups added to each step's batch."""
    as_of_snapshot: int | None = Field(None, ge=0)
    """Read the source as of this snapshot (None: live)."""

    writes: ClassVar[frozenset[str]] = frozenset({col.PARENT_ID, col.REPLAY_COUNT, SOURCE_COLUMN})

    @field_validator("where")
    @classmethod
    def _one_condition(cls, value: str) -> str:
        try:
            statements = duckdb.extract_statements(f"SELECT 1 FROM t WHERE ({value})")
        except duckdb.Error as err:
            raise ValueError(f"where {value!r} is not a SQL condition: {err}") from None
        if len(statements) != 1:
            raise ValueError(f"where {value!r} must be one SQL condition, not several statements")
        return value

    def augment(self, ctx: StepContext, batch: pa.Table) -> pa.Table:
        source = self.history(ctx)
        try:
            keys = source.candidate_groups(self.where, exclude_run=ctx.run_id)
        except Exception as err:  # the backend's SQL error on a bad condition
            raise ValueError(f"stage {self.label!r}: field 'where' = {self.where!r} does not "
                             f"select from store {self.source!r}: {err}") from err
        if keys.num_rows == 0:
            return batch
        take = ctx.rng(self.label).choice(keys.num_rows, size=min(self.groups, keys.num_rows),
                                          replace=False)
        picked = keys.take(pa.array(np.sort(take), pa.int64()))
        wanted = list(zip(picked.column(0).to_pylist(), picked.column(1).to_pylist()))
        chosen = _reads.as_rollouts(source.group_rows(wanted, exclude_run=ctx.run_id))
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
