"""Rollout rows from trajectories (:mod:`gfcr.core.trajectory`): one row builder,
:func:`rollout_row`, for every Generate stage (single-turn samples, trees, episodes, an
agent's calls: :func:`episode_rows`).

Also the plan's ``recycle`` column, the contract between a Replay stage that brings back
unfinished groups (``stages.replay.recycle.RecyclePartials``) and a Generate stage that
continues them, and the rule that a group is trained whole (:func:`hold_unfinished_groups`).
A generate stage that honours the column declares ``continues_partials = True``
(:data:`CONTINUES_PARTIALS`); the pipeline refuses a recycling stage beside one that
does not, since its pending partials would be picked again every step, never continued.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable, Sequence

import pyarrow as pa

from gfcr.core.engine import Engine, GenOutput
from gfcr.core.rollout import (NEW_TOKENS, RECYCLE, RECYCLE_TYPE, ROLLOUT_SCHEMA, SERVER,  # noqa: F401
                               FinishReason, Status, col, stable_id)
from gfcr.core.stage import StepContext
from gfcr.core.trajectory import Branch, Exchange, Trajectory, branches

CONTINUES_PARTIALS = "continues_partials"
"""Name of the ClassVar (bool) by which a generate stage says it honours ``recycle``."""

GENERATED_SCHEMA = pa.schema(list(ROLLOUT_SCHEMA) + [pa.field(NEW_TOKENS, pa.int32())])
"""What :func:`to_table` returns: the rollout schema and :data:`gfcr.core.rollout.NEW_TOKENS`."""

STATUS_OF = {"stop": "complete", "length": "complete", "aborted": "partial",
             "pruned": "pruned"}


@dataclass(frozen=True)
class Made:
    """How a row's policy tokens were made: the policy versions of its first and last
    token, why its last policy turn ended, the seconds it took, and the fleet server of
    its last policy turn (None: this process)."""

    version_start: int
    version_end: int
    finish_reason: FinishReason
    seconds: float = 0.0
    server: str | None = None

    @classmethod
    def by(cls, outputs: Sequence[GenOutput], engine: Engine, *,
           finish: FinishReason = "stop", seconds: float | None = None) -> "Made":
        """Of the engine outputs of a row's policy turns, in order (none: the engine's
        version now, ``finish``); ``seconds`` their sum unless given."""
        return cls(min((o.version_start for o in outputs), default=engine.version),
                   max((o.version_end for o in outputs), default=engine.version),
                   outputs[-1].finish_reason if outputs else finish,
                   sum(o.seconds for o in outputs) if seconds is None else seconds,
                   outputs[-1].server if outputs else None)


def rollout_row(ctx: StepContext, prompt: dict[str, Any], group_id: str, sample_idx: int,
                traj: Trajectory, made: Made, engine: Engine, *, parent_id: str | None = None,
                new_tokens: int | None = None, rollout_id: str | None = None,
                status: Status | None = None, reward: float | None = None,
                score_error: str | None = None) -> dict[str, Any]:
    """The rollout row of trajectory ``traj`` (its ``turns``, and the flat columns they
    imply: :func:`gfcr.core.trajectory.flat`) from plan row ``prompt``: every generate
    stage builds its rows here. ``new_tokens``: the policy tokens generated in this step
    (default: every policy turn's; less for a continued or carried prefix, a shared
    branch); ``status``: by default from ``made.finish_reason``; on a fleet, ``server``."""
    flat = traj.flat()
    return {
        col.RUN_ID: ctx.run_id, col.STEP: ctx.step,
        col.ROLLOUT_ID: rollout_id or stable_id(ctx.run_id, ctx.step, group_id, sample_idx),
        col.PROMPT_ID: prompt[col.PROMPT_ID], col.GROUP_ID: group_id,
        col.SAMPLE_IDX: sample_idx, col.PARENT_ID: parent_id,
        col.TASK: prompt[col.TASK], col.PROMPT: prompt[col.PROMPT],
        col.ANSWER: prompt.get(col.ANSWER), col.META: prompt.get(col.META),
        col.COMPLETION: engine.decode(flat.completion_ids),
        col.PROMPT_IDS: flat.prompt_ids, col.COMPLETION_IDS: flat.completion_ids,
        col.LOGPROBS: flat.logprobs,
        col.POLICY_VERSION_START: made.version_start, col.POLICY_VERSION_END: made.version_end,
        col.FINISH_REASON: made.finish_reason,
        col.STATUS: status or STATUS_OF[made.finish_reason],
        col.REWARD: reward, col.REWARDS: None, col.SCORE_ERROR: score_error,
        col.ADVANTAGE: None, col.KEPT: True, col.DROPPED_BY: None, col.DROP_REASON: None,
        col.CONSUMED_AT_STEP: None, col.REPLAY_COUNT: 0,
        col.N_TOKENS: len(flat.completion_ids), col.GEN_SECONDS: made.seconds,
        col.CREATED_AT: datetime.now(timezone.utc), col.TURNS: traj.rows(),
        NEW_TOKENS: traj.policy_tokens() if new_tokens is None else new_tokens,
        **({SERVER: made.server} if made.server is not None else {}),
    }


def single_turn(prompt_ids: list[int], completion_ids: Sequence[int],
                logprobs: Sequence[float], hint_tokens: int = 0) -> Trajectory:
    """A single-turn sample as a trajectory: the prompt, the first ``hint_tokens``
    completion tokens as a forced turn (ADHint's hint), the rest as the policy's turn."""
    h = max(0, min(int(hint_tokens or 0), len(completion_ids)))
    return (Trajectory().start_ids(prompt_ids).force(completion_ids[:h], logprobs[:h])
            .add_policy(completion_ids[h:], logprobs[h:]))


def to_table(rows: list[dict[str, Any]], schema: pa.Schema = GENERATED_SCHEMA) -> pa.Table:
    """Rows of :func:`rollout_row` as a table in ``schema`` (a generate stage's: by default
    :data:`GENERATED_SCHEMA`), with the ``server`` column when a fleet generated any of
    them (gfcr.core.rollout.SERVER)."""
    if any(SERVER in r for r in rows):
        schema = schema.append(pa.field(SERVER, pa.string()))
    return pa.Table.from_pylist(rows, schema=schema)


def plan_samples(prompt: dict[str, Any], default_n: int) -> list[dict[str, Any]]:
    """The samples a plan row asks for: its ``recycle`` structs, or ``n`` fresh ones."""
    recycled = prompt.get(RECYCLE)
    if recycled is not None:
        return sorted(recycled, key=lambda s: s["sample_idx"])
    n = default_n if prompt.get("n") is None else int(prompt["n"])
    return [{"sample_idx": i, "parent_id": None, "prefix_ids": [], "prefix_logprobs": [],
             "policy_version_start": None, "policy_version_end": None, "finish_reason": None,
             "hint_tokens": None, "exemplars": None} for i in range(n)]


def carried(sample: dict[str, Any]) -> Made:
    """A finished sample carried over unchanged (no tokens generated, versions kept)."""
    return Made(sample["policy_version_start"], sample["policy_version_end"],
                sample["finish_reason"])


def continued(out: GenOutput, sample: dict[str, Any]) -> Made:
    """A generated sample; a continuation keeps the policy version of its first token
    (the original's)."""
    start = sample.get("policy_version_start")
    return Made(out.version_start if start is None else int(start), out.version_end,
                out.finish_reason, out.seconds, out.server)


def hold_unfinished_groups(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A group is trained whole: when any sample of a group was stopped (partial), its
    finished samples are held as partial too (their ``finish_reason`` is kept), to be
    carried over when the group is continued. Pruned samples do not hold a group.

    This is how APRIL and slime recycle an unfinished group (Zhou et al. 2025): the group
    advantage is then computed over all of its samples, never over the early finishers.
    """
    held = {r[col.GROUP_ID] for r in rows if r[col.STATUS] == "partial"}
    for r in rows:
        if r[col.GROUP_ID] in held and r[col.STATUS] == "complete":
            r[col.STATUS] = "partial"
    return rows


# ------------------------------------------------------------------- an agent's episodes


def task_fields(prompt: dict[str, Any]) -> dict[str, Any]:
    """What the agent function gets of a task row: ``prompt`` and ``question`` (its
    text), ``answer``, ``meta`` (parsed when it is JSON), ``task`` and ``prompt_id``."""
    meta = prompt.get(col.META)
    try:
        meta = json.loads(meta) if isinstance(meta, str) else meta
    except ValueError:
        pass
    return {"prompt": prompt[col.PROMPT], "question": prompt[col.PROMPT],
            "answer": prompt.get(col.ANSWER), "meta": meta, "task": prompt[col.TASK],
            "prompt_id": prompt[col.PROMPT_ID]}


def episode_rows(ctx: StepContext, prompt: dict[str, Any], group_id: str, sample_idx: int,
                 calls: Sequence[tuple[Exchange, GenOutput]], first: Callable[[], list[int]],
                 engine: Engine, *, reward: float | None, error: str | None,
                 seconds: float) -> list[dict[str, Any]]:
    """One row per trajectory of an agent's episode (its answered ``calls`` split by
    :func:`gfcr.core.trajectory.branches`; when it made none, one row of the prompt
    ``first()`` alone), each with the episode's reward (0 when it failed), error and
    seconds."""
    paths = branches([exchange for exchange, _ in calls])
    if not paths:
        paths = [Branch(Trajectory().start_ids(first()), None, [])]
    ids = [stable_id(ctx.run_id, ctx.step, group_id, sample_idx, b) for b in range(len(paths))]
    return [rollout_row(ctx, prompt, group_id, sample_idx, path.trajectory,
                        Made.by([calls[i][1] for i in path.calls], engine, finish="aborted",
                                seconds=seconds), engine,
                        parent_id=None if path.parent is None else ids[path.parent],
                        rollout_id=ids[b], status="complete",
                        reward=0.0 if reward is None else reward, score_error=error)
            for b, path in enumerate(paths)]
