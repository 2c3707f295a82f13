"""The rollout schema, declared once.

Every stage sees and returns Arrow tables in ``ROLLOUT_SCHEMA`` (plus the extra columns it
declares); the store persists exactly these columns. A row is one trajectory from a prompt
to termination, or a segment of one (a partial rollout continued later points at its
predecessor through ``parent_id``). Rows are never deleted by a filter: a dropped rollout
keeps its row with ``kept = false`` and the name of the stage and the reason.

Column names are reached through :data:`col` so a typo is an ``AttributeError``, not a
silently missing column.

**Trajectory form.** A rollout is a sequence of turns (``turns``, of
:data:`gfcr.core.trajectory.TURN_TYPE`), the rollout's one body
(:mod:`gfcr.core.trajectory`); the flat columns (``prompt_ids``, ``completion_ids``,
``logprobs``) are derived from it by one rule (:func:`gfcr.core.trajectory.flat`), which
:func:`conform` applies to every row that has turns. A row without turns (written by a
stage that fills only the flat columns, or stored before turns existed) gets its
single-turn form (:func:`gfcr.core.turncols.single_turns`: the prompt, a forced-prefix
turn when ``hint_tokens`` > 0, the policy's turn), so every conformed table has both.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gfcr.core.trajectory import BRANCH_TYPE, TURN_TYPE, TURNS_TYPE
from gfcr.core.turncols import flat_columns, single_turns

FinishReason = Literal["stop", "length", "aborted", "pruned"]
Status = Literal["complete", "partial", "pruned"]


@dataclass(frozen=True)
class Column:
    """One column: its Arrow type, whether it may be null, and what it means."""

    name: str
    type: pa.DataType
    nullable: bool
    doc: str


_IDS = pa.list_(pa.int32())

COLUMNS: tuple[Column, ...] = (
    Column("run_id", pa.string(), False, "Pipeline run that produced the row."),
    Column("step", pa.int64(), False, "Loop step at which the row was committed (0-based)."),
    Column("rollout_id", pa.string(), False, "Unique id of this trajectory or segment."),
    Column("prompt_id", pa.string(), False, "Stable hash of (task, prompt); see prompt_id()."),
    Column("group_id", pa.string(), False, "Samples of one prompt drawn together share it."),
    Column("sample_idx", pa.int32(), False, "Index of the sample inside its group."),
    Column("parent_id", pa.string(), True, "Rollout this one continues or branches from."),
    Column("task", pa.string(), False, "Task (dataset) name the prompt came from."),
    Column("prompt", pa.string(), False, "Prompt text as given to the policy."),
    Column("answer", pa.string(), True, "Reference answer, when the task has one."),
    Column("meta", pa.string(), True, "Task metadata as JSON (what the task's scorer needs)."),
    Column("completion", pa.string(), False, "Generated text (without the prompt)."),
    Column("prompt_ids", _IDS, False, "Prompt token ids."),
    Column("completion_ids", _IDS, False, "Generated token ids, including any continued prefix."),
    Column("logprobs", pa.list_(pa.float32()), False,
           "Behaviour-policy log-probability of each completion token (same length)."),
    Column("policy_version_start", pa.int64(), False, "Policy version of the first token."),
    Column("policy_version_end", pa.int64(), False, "Policy version of the last token."),
    Column("finish_reason", pa.string(), False, "stop | length | aborted | pruned."),
    Column("status", pa.string(), False, "complete | partial (to be continued) | pruned."),
    Column("reward", pa.float64(), True, "Scalar reward used for training; null before scoring."),
    Column("rewards", pa.map_(pa.string(), pa.float64()), True,
           "One entry per verifier or reward component."),
    Column("score_error", pa.string(), True, "Error raised by a scorer on this rollout, if any."),
    Column("advantage", pa.float64(), True, "Advantage the trainer used; null if not trained on."),
    Column("kept", pa.bool_(), False, "False once a filter dropped the row."),
    Column("dropped_by", pa.string(), True, "Name of the stage that dropped the row."),
    Column("drop_reason", pa.string(), True, "Why that stage dropped it."),
    Column("consumed_at_step", pa.int64(), True, "Step whose update trained on the row."),
    Column("replay_count", pa.int32(), False, "How many times the row was replayed."),
    Column("n_tokens", pa.int32(), False, "len(completion_ids)."),
    Column("gen_seconds", pa.float64(), False, "Wall time spent generating the row's tokens."),
    Column("created_at", pa.timestamp("us", tz="UTC"), False, "When the row was generated."),
    Column("turns", pa.list_(TURN_TYPE), True,
           "The trajectory as turns (TURN_TYPE); null only in rows stored before it existed."),
)

ROLLOUT_SCHEMA = pa.schema([pa.field(c.name, c.type, nullable=c.nullable) for c in COLUMNS])
"""The Arrow schema of a rollout table."""

col = SimpleNamespace(**{c.name.upper(): c.name for c in COLUMNS})
"""Column names as attributes: ``col.PROMPT_ID == "prompt_id"``."""

NEW_TOKENS = "new_tokens"
"""Optional extra column (int32) that generate stages write: the completion tokens the
policy generated for the row in the step that made it — ``n_tokens`` minus a prefix it
did not generate then (a continued partial's stored tokens, a tree branch's shared
prefix, a forced hint), 0 for a finished sample carried over unchanged. The loop's
``tokens`` metric sums it over the step's rows that are not replayed; a row without it
(a generate stage that does not write it, a row stored before it existed) counts
``n_tokens``."""

PLAN_N = "n"
"""Plan column (int64): samples to draw for the prompt; null: the generate stage's own."""
PLAN_MAX_TOKENS = "max_tokens"
"""Plan column (int64): the prompt's token cap; null: the generate stage's own."""
PLAN_MAX_TURNS = "max_turns"
"""Plan column (int64): the most policy turns an episode of the prompt may take (a
multi-turn generate stage ends it there, with the turn limit as its reason); null: the
generate stage's own. Written by turn-budget control stages (stages.control.turns)."""
PLAN_COLUMNS = frozenset({PLAN_N, PLAN_MAX_TOKENS})
"""Columns a plan (what allocate stages read and write) adds to a prompt table."""

# ---------------------------------------------------------------- cross-kind columns
# Extra columns one kind of stage writes and another reads, declared once here so no
# operator imports another kind's module for a column name. Two keep the name of the
# method that first wrote them though their meaning is general (HINT_TOKENS: forced
# tokens; D3S_ADVANTAGE: an advantage override): they are column names in every store
# written so far (the rollouts table, the recycle struct a resumed run's plan carries),
# so a rename would have a resume or a what-if over an older store read nulls. It needs
# a store migration (new name, old one read as an alias), not a new constant.

RECYCLE = "recycle"
"""Plan column of a recycled group: one struct per sample (:data:`RECYCLE_TYPE`), null for
a fresh prompt; a replay stage that brings back unfinished groups writes it, a generate
stage that continues partials (gfcr.core.capabilities.ContinuesPartials) honours it, control stages
count its samples. A recycled plan row also carries its original ``group_id``."""

RECYCLE_TYPE = pa.list_(pa.struct([
    ("sample_idx", pa.int32()), ("parent_id", pa.string()),
    ("prefix_ids", pa.list_(pa.int32())), ("prefix_logprobs", pa.list_(pa.float32())),
    ("policy_version_start", pa.int64()), ("policy_version_end", pa.int64()),
    ("finish_reason", pa.string()), ("hint_tokens", pa.int32()), ("exemplars", pa.int32())]))
"""Per sample of a recycled group, what to do with the stored row ``parent_id``:
continue it from ``prefix_ids``/``prefix_logprobs`` (``finish_reason`` null), carry it
over unchanged (a finished sibling: ``finish_reason`` set), or restart it from scratch
(empty prefix, ``policy_version_start`` null). ``hint_tokens`` and ``exemplars`` are the
stored row's marks of conditioned generation (null when it has none): a continuation
keeps them, since its prefix and prompt are the stored ones."""

HINT_TOKENS = "hint_tokens"
"""Forced tokens (int32): the row's leading completion tokens were forced, not sampled
(ADHint's hints, written by stages.generate.conditioned; any generate stage that forces a
prefix may write it). The trainer keeps them in the sequence but masks them out of the
loss."""

EXEMPLARS = "exemplars"
"""Extra column (int32): solved exemplars prepended to the prompt (0: none)."""

TOKEN_KEEP_RATIO = "token_keep_ratio"
"""Token keep ratio (float64, null = keep every token): the share of the batch's loss
tokens the trainer keeps, chosen by its token selector (stages.train.selection; D³S's by
default) from its own forward pass. A filter writes it (stages.filter.d3s)."""

SERVER = "server"
"""Extra column (string, null = generated in the run's process or carried over): the
URL of the fleet server (gfcr.transport.fleet) that generated the row's last tokens (a
multi-turn row's: the server of its last policy turn). Only a run that generates on a
fleet writes it."""

D3S_ADVANTAGE = "d3s_advantage"
"""Advantage override (float64, null = none): where present, the trainer trains the row
on this advantage as is (loss, token ranking, stored ``advantage``) instead of its
estimator's. D³S writes each row's advantage within its whole group; any filter that
chooses rows on advantages may write it."""

EPISODE_END = "episode_end"
"""Extra column (string, null for a single-turn row) that multi-turn generate stages
write: why the episode ended (gfcr.core.environment.EPISODE_ENDS: ``done``, ``turn_limit``,
``token_limit``, ``length``, ``env_error``, ``env_timeout``). The doctor and the report
read it (turn-limit truncation, failing environments)."""

TURN_COUNT = "n_turns"
"""Extra column (int32) that multi-turn generate stages write: the policy turns of the
episode."""


TURN_ADVANTAGES = "turn_advantages"
"""Per-turn advantages (list<float64>, one entry per turn of the row's ``turns``; the row
null, or an entry null: that turn's tokens train on the row's advantage). Where present
the learner gives every loss token of a turn its turn's advantage (step-level credit:
GiGPO's anchor-state groups, IGPO's turn rewards; stages.filter.gigpo, stages.filter.igpo)."""

BRANCH = "branch"
"""Plan column of a branched episode (:data:`BRANCH_TYPE`; null for a fresh one): a
multi-turn generate stage starts each of the row's ``n`` episodes from the stored turns
``turns`` of row ``parent_id`` (kept as given: the replay stage that writes it sets their
masks), lets the policy take the next turn, and records the new rows with that
``parent_id``. Fission-GRPO's recovery rollouts branch at a tool error
(stages.replay.fission)."""

def stable_id(*parts: Any) -> str:
    """Deterministic id from its parts, so every executor names rows the same."""
    return hashlib.sha256("\x00".join(map(str, parts)).encode()).hexdigest()[:16]


PROMPT_COLUMNS = frozenset({col.PROMPT_ID, col.TASK, col.PROMPT, col.ANSWER, col.META})
"""Columns a prompt table (what Replay.select returns) carries."""

PROMPT_SCHEMA = pa.schema([ROLLOUT_SCHEMA.field(c) for c in
                           (col.PROMPT_ID, col.TASK, col.PROMPT, col.ANSWER, col.META)])
"""The Arrow schema of a prompt table."""


def prompt_id(task: str, prompt: str) -> str:
    """Stable id of a prompt: the same task and text always give the same id."""
    return hashlib.sha256(f"{task}\x00{prompt}".encode()).hexdigest()[:16]


def empty_rollouts() -> pa.Table:
    """A rollout table with no rows."""
    return ROLLOUT_SCHEMA.empty_table()


def conform(table: pa.Table, *, where: str = "table") -> pa.Table:
    """Return ``table`` with the schema's columns first, in schema order and types.

    Extra columns a pipeline declared are kept after them. A row's flat token columns are
    derived from its turns where it has them (:func:`with_flat`), and its turns from its
    flat columns where it has none (:func:`with_turns`). Raises ``SchemaError`` naming
    every missing column and every column whose type cannot be cast.
    """
    table = with_turns(with_flat(table, where))
    problems: list[str] = []
    arrays: list[pa.ChunkedArray] = []
    for field in ROLLOUT_SCHEMA:
        if field.name not in table.column_names:
            problems.append(f"missing column {field.name!r} ({field.type})")
            continue
        arrays.append(_cast(table.column(field.name), field, problems))
    if problems:
        raise SchemaError(f"{where} does not match the rollout schema: " + "; ".join(problems))
    extra = [n for n in table.column_names if n not in ROLLOUT_SCHEMA.names]
    names = ROLLOUT_SCHEMA.names + extra
    return pa.table(arrays + [table.column(n) for n in extra], names=names)


def _cast(column: pa.ChunkedArray, field: pa.Field, problems: list[str]) -> pa.ChunkedArray:
    if column.type != field.type:
        try:
            column = column.cast(field.type)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            problems.append(f"column {field.name!r} has type {column.type}, expected {field.type}")
            return column
    if not field.nullable and column.null_count:
        problems.append(f"column {field.name!r} has {column.null_count} null value(s)")
    return column


_FLAT = (col.PROMPT_IDS, col.COMPLETION_IDS, col.LOGPROBS)


def with_flat(table: pa.Table, where: str = "table") -> pa.Table:
    """``table`` with the flat token columns of every row that has turns derived from them
    (:func:`gfcr.core.turncols.flat_columns`: the turns are the rollout's body); rows
    without turns keep theirs. Turns that do not fit the turn type, or give a turn
    logprobs not one per token, are a ``SchemaError`` naming the row."""
    turns = table.column(col.TURNS) if col.TURNS in table.column_names else None
    if turns is None or turns.null_count == len(turns):
        return table
    try:
        derived = flat_columns(turns)
    except (ValueError, pa.ArrowTypeError, pa.ArrowNotImplementedError) as err:
        raise SchemaError(f"{where}: column {col.TURNS!r}: {err}") from None
    given = turns.is_valid()
    for name, values in zip(_FLAT, derived):
        field = ROLLOUT_SCHEMA.field(name)
        if name not in table.column_names:
            table = table.append_column(field, values)
            continue
        at = table.column_names.index(name)
        try:
            table = table.set_column(at, field, pc.if_else(
                given, values, table.column(name).cast(field.type)))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            pass  # a column of the wrong type: conform names it
    return table


def with_turns(table: pa.Table) -> pa.Table:
    """``table`` with a ``turns`` column: rows that have none get their single-turn form
    (:func:`single_turns`); a table without the token columns is returned as it is (for
    :func:`conform` to name what it lacks)."""
    if not set(_FLAT) <= set(table.column_names):
        return table
    have = table.column(col.TURNS) if col.TURNS in table.column_names else None
    if have is not None and not have.null_count:
        return table
    hints = (table.column(HINT_TOKENS).to_numpy(zero_copy_only=False)
             if HINT_TOKENS in table.column_names else np.zeros(table.num_rows))
    derived = single_turns(table.column(col.PROMPT_IDS), table.column(col.COMPLETION_IDS),
                           table.column(col.LOGPROBS), np.nan_to_num(hints).astype(np.int64))
    if have is None:
        return table.append_column(ROLLOUT_SCHEMA.field(col.TURNS), derived)
    turns = pc.if_else(pc.is_null(have), derived, have.cast(TURNS_TYPE))
    return table.set_column(table.column_names.index(col.TURNS),
                            ROLLOUT_SCHEMA.field(col.TURNS), turns)


class SchemaError(ValueError):
    """A table does not fit ROLLOUT_SCHEMA; the message names each offending column."""


def describe() -> list[dict[str, Any]]:
    """The schema as rows (name, type, nullable, doc), for docs and ``gfcr schema``."""
    return [{"name": c.name, "type": str(c.type), "nullable": c.nullable, "doc": c.doc}
            for c in COLUMNS]


VERDICT_PREFIXES = ("Wrong:", "SandboxViolation:")
"""How a ``score_error`` that is a verdict on the program (stages.filter.verifiers.Wrong:
it crashed, hit a limit, cannot run) begins. Such a row scored 0 and was kept; it is no
scorer failure, so warnings, the report's error share and the doctor leave it out."""

SCORER_FAILED_SQL = ("(score_error IS NOT NULL AND NOT regexp_matches(score_error, "
                     "'^(Wrong|SandboxViolation):'))")
"""SQL predicate over ``rollouts``: the scorer failed on the row (a verdict does not count)."""


def scorer_failed(message: str | None) -> bool:
    """Whether a ``score_error`` value is a scorer failure, not a verdict."""
    return bool(message) and not str(message).startswith(VERDICT_PREFIXES)
