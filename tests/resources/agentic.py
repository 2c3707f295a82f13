"""Hand-built multi-turn rollouts (gfcr.core.trajectory.TURN_TYPE) and runs of them committed to a
real store, for the agentic operators, the ``turns`` view, the report and the doctor."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from gfcr.core.rollout import col
from gfcr.core.trajectory import TURNS_TYPE
from tests.resources.rollouts import rollouts

PROMPT = [1, 2]


def turn(source: str, ids: list[int], *, tool_name: str | None = None,
         tool_error: str | None = None, reward: float | None = None,
         mask: list[bool] | None = None, logprob: float = -0.5) -> dict[str, Any]:
    """One turn; a policy (or forced) turn gets logprobs ``logprob`` per token and a mask
    (all in the loss for the policy's, none for a forced prefix, unless ``mask``)."""
    role = {"environment": "user", "tool": "tool"}.get(source, "assistant")
    assistant = source in ("policy", "forced")
    if mask is None and assistant:
        mask = [source == "policy"] * len(ids)
    return {"role": role, "source": source, "token_ids": ids,
            "logprobs": [logprob] * len(ids) if assistant else None,
            "mask": mask if assistant else None, "tool_name": tool_name,
            "tool_error": tool_error, "reward": reward}


def episodes(trajectories: list[list[dict[str, Any]]], groups: list[str] | None = None,
             rewards: list[float | None] | None = None, **columns: Any) -> pa.Table:
    """One row per trajectory, its flat token columns derived from its turns (prompt: the
    first turn; completion: the later ones in order, logprobs 0 where a turn has none)."""
    n = len(trajectories)
    later = [[i for t in tr[1:] for i in t["token_ids"]] for tr in trajectories]
    lps = [[v for t in tr[1:] for v in (t["logprobs"] or [0.0] * len(t["token_ids"]))]
           for tr in trajectories]
    table = rollouts(groups or ["g"] * n, rewards or [1.0] * n,
                     completion=["".join(t["role"][0] for t in tr) for tr in trajectories],
                     **columns)
    for name, values, kind in ((col.PROMPT_IDS, [tr[0]["token_ids"] for tr in trajectories], None),
                               (col.COMPLETION_IDS, later, None), (col.LOGPROBS, lps, None),
                               (col.N_TOKENS, [len(x) for x in later], None),
                               (col.TURNS, trajectories, TURNS_TYPE)):
        field = table.schema.field(name)
        table = table.set_column(table.column_names.index(name), field,
                                 pa.array(values, kind or field.type))
    return table


def committed_run(store: Any, run_id: str, steps: list[pa.Table]) -> None:
    """A run with a real stored spec (the tiny pipeline) and one committed step per table
    (its run id and step set, rollout ids made unique)."""
    from tests.conftest import tiny_pipeline

    spec = tiny_pipeline(name=run_id, steps=len(steps))
    store.start_run(run_id, pipeline=spec.name, spec_yaml=spec.to_yaml(),
                    spec_hash=spec.spec_hash(), code_version="test")
    for step, table in enumerate(steps):
        n = table.num_rows
        for name, values in ((col.RUN_ID, [run_id] * n), (col.STEP, [step] * n),
                             (col.ROLLOUT_ID, [f"{run_id}/{step}/{i}" for i in range(n)]),
                             (col.GROUP_ID, [f"{run_id}/{step}/{g}" for g in
                                             table.column(col.GROUP_ID).to_pylist()])):
            field = table.schema.field(name)
            table = table.set_column(table.column_names.index(name), field,
                                     pa.array(values, field.type))
        store.commit_step(run_id, step, table, policy_version=step, metrics={})
    store.finish_run(run_id, "finished")
