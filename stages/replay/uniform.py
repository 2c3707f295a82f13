"""Uniform prompt sampling: the plain data loader of RL fine-tuning, as a Replay stage."""

from __future__ import annotations

from typing import ClassVar, Literal

import pyarrow as pa
from pydantic import Field

from gfcr.core.rollout import PROMPT_COLUMNS, PROMPT_SCHEMA
from gfcr.core.stage import StageSpec, StepContext
from gfcr.core.registry import register


@register("replay")
class UniformSampler(StageSpec):
    """Fill the step's prompt batch with prompts drawn uniformly from the task.

    Prompts are drawn without replacement inside a step and independently across steps,
    from a generator seeded by (run seed, step, stage name), so a resumed run draws what
    the uninterrupted run drew. Prompts already chosen by an earlier select stage count
    towards ``batch``; in a refill round the step's quota replaces ``batch``.

    >>> UniformSampler(batch=16)
    UniformSampler(name=None, type='uniform', batch=16)
    """

    type: Literal["uniform"] = "uniform"
    batch: int = Field(16, ge=1)
    """Prompts per step."""

    writes: ClassVar[frozenset[str]] = PROMPT_COLUMNS

    def select(self, ctx: StepContext, chosen: pa.Table) -> pa.Table:
        missing = (ctx.quota or self.batch) - chosen.num_rows
        if missing <= 0:
            return chosen
        pool = ctx.task.train_prompts()
        if pool.num_rows == 0:
            raise ValueError(f"stage {self.label!r}: the task has no training prompts")
        rng = ctx.rng(self.label)
        take = rng.choice(pool.num_rows, size=missing, replace=missing > pool.num_rows)
        drawn = pool.take(pa.array(take)).select(PROMPT_SCHEMA.names).cast(PROMPT_SCHEMA)
        # an earlier stage may have added plan columns (e.g. recycled groups): nulls here
        return pa.concat_tables([chosen, drawn], promote_options="permissive")
