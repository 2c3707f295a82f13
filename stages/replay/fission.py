"""Branching at tool errors, after Fission-GRPO ("Robust Tool Use via Fission-GRPO: Learning
to Recover from Execution Errors", 2025).

Fission-GRPO turns each trajectory that failed on a tool call into a new training
instance: the trajectory up to the error, with diagnostic feedback, from which recovery
rollouts are resampled on-policy inside the RL loop, so the policy learns what to do
after an error rather than only to avoid one.

:class:`FissionBranch` reads, from the run's store as of the step, the recent attempts
with a tool error that nothing branched from yet (two typed reads, ``History.rows``), and puts
one plan row per such trajectory first in the step's plan: ``n`` recovery episodes (one
group) that start from its turns up to and including its first tool error turn (the
plan's ``branch`` column, :data:`gfcr.core.rollout.BRANCH`) and go on from the policy's next
turn; each new row names the failed one as its ``parent_id``. The prefix's policy turns
are kept with their tokens and logprobs but out of the loss (their masks all false):
they trained with the row they came from, and the recovery group's advantage should
credit only what follows the error.

Departures from Fission-GRPO: the feedback is the tool's own error message, already the
turn the branch ends with (the paper's comes from a fine-tuned Error Simulator); the
failed trajectories come from earlier steps of the run through the store (the paper
fissions within the step), so a resumed run branches exactly the same ones.

>>> FissionBranch(n=4, max_branches=2)  # doctest: +ELLIPSIS
FissionBranch(name=None, type='fission_branch', n=4, max_branches=2, window=1)
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import pyarrow as pa
from pydantic import Field

from gfcr.core.capabilities import ContinuesBranches
from gfcr.core.rollout import BRANCH, PROMPT_COLUMNS, PROMPT_SCHEMA, col, stable_id
from gfcr.core.trajectory import BRANCH_TYPE
from gfcr.core.row_filter import ASCENDING, DESCENDING, RowFilter
from gfcr.core.stage import StageSpec, StepContext
from gfcr.core.registry import register
from gfcr.core.storage import History

PLAN_SCHEMA = pa.schema(list(PROMPT_SCHEMA) + [
    pa.field(col.GROUP_ID, pa.string()), pa.field("n", pa.int64()), pa.field(BRANCH, BRANCH_TYPE)])
"""What FissionBranch returns: prompt columns plus the branch group's id, size and start
(all null on rows of fresh prompts)."""


@register("replay")
class FissionBranch(StageSpec):
    """Plan recovery episodes from the run's recent tool errors (see the module docstring)."""

    type: Literal["fission_branch"] = "fission_branch"
    n: int = Field(4, ge=2)
    """Recovery episodes per failed trajectory (one group: at least 2 for an advantage)."""
    max_branches: int = Field(4, ge=1)
    """Failed trajectories branched per step at most (the newest first)."""
    window: int = Field(1, ge=1)
    """How many steps back failed trajectories are taken from."""

    writes: ClassVar[frozenset[str]] = PROMPT_COLUMNS | {col.GROUP_ID, "n", BRANCH}

    def check_pipeline(self, stages: tuple[StageSpec, ...]) -> list[str]:
        """The generate stage must start episodes from the branches this stage plans."""
        return [f"stages {self.label!r} and {s.label!r}: {self.label!r} plans episodes that "
                f"start from stored turns (the plan's {BRANCH!r} column), but generate stage "
                f"{s.label!r} ({type(s).__name__}) does not declare continues_branches, so "
                "it would sample them from the prompt; use a multi-turn generate stage that "
                f"continues branches, or remove {self.label!r}"
                for s in stages if s.kind == "generate"
                and not (isinstance(s, ContinuesBranches) and s.continues_branches)]

    def select(self, ctx: StepContext, chosen: pa.Table) -> pa.Table:
        if ctx.round or ctx.history is None or ctx.step == 0:
            return _with_plan_columns(chosen)
        failed = unbranched_errors(ctx.history, since_step=ctx.step - self.window,
                                   limit=self.max_branches)
        plan = pa.Table.from_pylist([self._branch(row) for row in failed], schema=PLAN_SCHEMA)
        return pa.concat_tables([plan, _with_plan_columns(chosen)], promote_options="permissive")

    def _branch(self, row: dict[str, Any]) -> dict[str, Any]:
        return {**{c: row[c] for c in PROMPT_SCHEMA.names},
                col.GROUP_ID: stable_id(row[col.ROLLOUT_ID], "fission"), "n": self.n,
                BRANCH: {"parent_id": row[col.ROLLOUT_ID], "turns": error_prefix(row[col.TURNS])}}


def unbranched_errors(history: History, *, since_step: int, limit: int
                      ) -> list[dict[str, Any]]:
    """The run's attempts from ``since_step`` on with a turn whose ``tool_error`` is set
    and no row naming them as ``parent_id``, newest step first (then by rollout id), at
    most ``limit``, with every column the store has."""
    recent = history.rows(RowFilter.attempts(step_min=max(0, since_step)),
                          order_by=((col.STEP, DESCENDING), (col.ROLLOUT_ID, ASCENDING)))
    failed = [row for row in recent.to_pylist()
              if any(t["tool_error"] is not None for t in row[col.TURNS] or ())]
    if not failed:
        return []
    children = history.rows(RowFilter(parent_ids=tuple(r[col.ROLLOUT_ID] for r in failed)),
                            columns=[col.PARENT_ID])
    branched = set(children.column(col.PARENT_ID).to_pylist())
    return [row for row in failed if row[col.ROLLOUT_ID] not in branched][:limit]


def error_prefix(turns: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``turns`` up to and including the first one with a ``tool_error``, every mask set
    to False (in the sequence, out of the loss)."""
    end = next(k for k, t in enumerate(turns) if t["tool_error"] is not None)
    return [{**t, "mask": None if t["mask"] is None else [False] * len(t["mask"])}
            for t in turns[:end + 1]]


def _with_plan_columns(table: pa.Table) -> pa.Table:
    for f in PLAN_SCHEMA:
        if f.name not in table.column_names:
            table = table.append_column(f, pa.nulls(table.num_rows, f.type))
    return table
