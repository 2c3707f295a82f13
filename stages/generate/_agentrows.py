"""An agent episode's rows: the task fields an agent sees, and its trajectories as rollout
rows in the trajectory form (:data:`gfcr.core.rollout.TURN_TYPE`)."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

from gfcr.core.engine import Engine
from gfcr.core.rollout import NEW_TOKENS, SERVER, col, stable_id
from gfcr.core.stage import StepContext
from gfcr.core.trajectory import Branch, Trajectory, branches
from stages.generate._episodes import Episode


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
                 episode: Episode, engine: Engine, *, reward: float | None,
                 error: str | None, seconds: float) -> list[dict[str, Any]]:
    """One row per trajectory of the episode (one empty row when the agent made no
    call), each with the episode's reward (0 when it failed) and error, and, on a fleet,
    the server of its last policy turn."""
    with episode.lock:
        calls = list(episode.calls)
    paths = branches([c.exchange() for c in calls])
    if not paths:
        first = episode.codec.render([{"role": "user", "content": prompt[col.PROMPT]}], None)
        paths = [Branch(Trajectory().start_ids(first), None, [])]
    rows: list[dict[str, Any]] = []
    ids = [stable_id(ctx.run_id, ctx.step, group_id, sample_idx, b) for b in range(len(paths))]
    for branch, path in enumerate(paths):
        flat = path.trajectory.flat()
        outs = [o for o in (calls[i].output for i in path.calls) if o is not None]
        rows.append({
            col.RUN_ID: ctx.run_id, col.STEP: ctx.step, col.ROLLOUT_ID: ids[branch],
            col.PROMPT_ID: prompt[col.PROMPT_ID], col.GROUP_ID: group_id,
            col.SAMPLE_IDX: sample_idx,
            col.PARENT_ID: None if path.parent is None else ids[path.parent],
            col.TASK: prompt[col.TASK], col.PROMPT: prompt[col.PROMPT],
            col.ANSWER: prompt.get(col.ANSWER), col.META: prompt.get(col.META),
            col.COMPLETION: engine.decode(flat.completion_ids), col.PROMPT_IDS: flat.prompt_ids,
            col.COMPLETION_IDS: flat.completion_ids, col.LOGPROBS: flat.logprobs,
            col.POLICY_VERSION_START: min((o.version_start for o in outs), default=engine.version),
            col.POLICY_VERSION_END: max((o.version_end for o in outs), default=engine.version),
            col.FINISH_REASON: outs[-1].finish_reason if outs else "aborted",
            col.STATUS: "complete", col.REWARD: 0.0 if reward is None else reward,
            col.REWARDS: None, col.SCORE_ERROR: error, col.ADVANTAGE: None,
            col.KEPT: True, col.DROPPED_BY: None, col.DROP_REASON: None,
            col.CONSUMED_AT_STEP: None, col.REPLAY_COUNT: 0,
            col.N_TOKENS: len(flat.completion_ids),
            col.GEN_SECONDS: seconds, col.CREATED_AT: datetime.now(timezone.utc),
            col.TURNS: path.trajectory.rows(),
            NEW_TOKENS: sum(len(o.completion_ids) for o in outs),
            # on a fleet: the server of its last policy turn (gfcr.core.rollout.SERVER)
            **({SERVER: outs[-1].server} if outs and outs[-1].server is not None else {}),
        })
    return rows

