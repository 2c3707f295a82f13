"""An agent episode's rows: the task fields an agent sees, and its trajectories as rollout
rows in the trajectory form (:data:`gfcr.core.rollout.TURN_TYPE`)."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

from gfcr.core.engine import Engine
from gfcr.core.rollout import NEW_TOKENS, SERVER, col, stable_id
from gfcr.core.stage import StepContext
from stages.generate._episodes import Episode, Trajectory, trajectories


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
    paths = trajectories(calls)
    if not paths:
        first = episode.codec.render([{"role": "user", "content": prompt[col.PROMPT]}], None)
        paths = [Trajectory(first, [], None, [])]
    rows: list[dict[str, Any]] = []
    ids = [stable_id(ctx.run_id, ctx.step, group_id, sample_idx, b) for b in range(len(paths))]
    for branch, path in enumerate(paths):
        completion = [t for turn in path.turns for t in turn["token_ids"]]
        logprobs = [lp for turn in path.turns
                    for lp in (turn["logprobs"] or [0.0] * len(turn["token_ids"]))]
        outs = path.outputs
        rows.append({
            col.RUN_ID: ctx.run_id, col.STEP: ctx.step, col.ROLLOUT_ID: ids[branch],
            col.PROMPT_ID: prompt[col.PROMPT_ID], col.GROUP_ID: group_id,
            col.SAMPLE_IDX: sample_idx,
            col.PARENT_ID: None if path.parent is None else ids[path.parent],
            col.TASK: prompt[col.TASK], col.PROMPT: prompt[col.PROMPT],
            col.ANSWER: prompt.get(col.ANSWER), col.META: prompt.get(col.META),
            col.COMPLETION: engine.decode(completion), col.PROMPT_IDS: path.prompt_ids,
            col.COMPLETION_IDS: completion, col.LOGPROBS: logprobs,
            col.POLICY_VERSION_START: min((o.version_start for o in outs), default=engine.version),
            col.POLICY_VERSION_END: max((o.version_end for o in outs), default=engine.version),
            col.FINISH_REASON: outs[-1].finish_reason if outs else "aborted",
            col.STATUS: "complete", col.REWARD: 0.0 if reward is None else reward,
            col.REWARDS: None, col.SCORE_ERROR: error, col.ADVANTAGE: None,
            col.KEPT: True, col.DROPPED_BY: None, col.DROP_REASON: None,
            col.CONSUMED_AT_STEP: None, col.REPLAY_COUNT: 0, col.N_TOKENS: len(completion),
            col.GEN_SECONDS: seconds, col.CREATED_AT: datetime.now(timezone.utc),
            col.TURNS: [_prompt_turn(path.prompt_ids)] + path.turns,
            NEW_TOKENS: sum(len(o.completion_ids) for o in outs),
            # on a fleet: the server of its last policy turn (gfcr.core.rollout.SERVER)
            **({SERVER: outs[-1].server} if outs and outs[-1].server is not None else {}),
        })
    return rows


def _prompt_turn(ids: list[int]) -> dict[str, Any]:
    return {"role": "user", "source": "environment", "token_ids": ids, "logprobs": None,
            "mask": None, "tool_name": None, "tool_error": None, "reward": None}

