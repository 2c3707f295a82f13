"""Fixtures for the store tests: small rollout tables in ROLLOUT_SCHEMA and temp stores."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pyarrow as pa
import pytest

from gfcr.core.rollout import ROLLOUT_SCHEMA, col, prompt_id
from store import RolloutStore

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def make_rollouts(n: int, *, run_id: str = "run", step: int = 0, group_size: int = 4,
                  rewards: list[float | None] | None = None, **columns: list[Any]) -> pa.Table:
    """``n`` rollout rows in ROLLOUT_SCHEMA; ``columns`` override whole columns by name.

    Rows ``i`` belong to group ``i // group_size`` of prompt ``q<group>``; rewards default
    to alternating 1.0 / 0.0.
    """
    groups = [i // group_size for i in range(n)]
    reward = rewards if rewards is not None else [float(i % 2 == 0) for i in range(n)]
    data: dict[str, list[Any]] = {
        col.RUN_ID: [run_id] * n,
        col.STEP: [step] * n,
        col.ROLLOUT_ID: [f"{run_id}/{step}/{i}" for i in range(n)],
        col.PROMPT_ID: [prompt_id("add", f"q{g}") for g in groups],
        col.GROUP_ID: [f"{run_id}/{step}/g{g}" for g in groups],
        col.SAMPLE_IDX: [i % group_size for i in range(n)],
        col.PARENT_ID: [None] * n,
        col.TASK: ["add"] * n,
        col.PROMPT: [f"q{g}" for g in groups],
        col.ANSWER: [str(g) for g in groups],
        col.META: ['{"digits": 1}'] * n,
        col.COMPLETION: [f"answer {i}" for i in range(n)],
        col.PROMPT_IDS: [[1, 2, 3 + g] for g in groups],
        col.COMPLETION_IDS: [[7, 8, i] for i in range(n)],
        col.LOGPROBS: [[-0.5, -0.25, -0.125] for _ in range(n)],
        col.POLICY_VERSION_START: [step] * n,
        col.POLICY_VERSION_END: [step] * n,
        col.FINISH_REASON: ["stop"] * n,
        col.STATUS: ["complete"] * n,
        col.REWARD: reward,
        col.REWARDS: [None if r is None else [("correct", r), ("format", 1.0)] for r in reward],
        col.SCORE_ERROR: [None] * n,
        col.ADVANTAGE: [None] * n,
        col.KEPT: [True] * n,
        col.DROPPED_BY: [None] * n,
        col.DROP_REASON: [None] * n,
        col.CONSUMED_AT_STEP: [None] * n,
        col.REPLAY_COUNT: [0] * n,
        col.N_TOKENS: [3] * n,
        col.GEN_SECONDS: [0.01 * i for i in range(n)],
        col.CREATED_AT: [T0 + timedelta(seconds=step * 60 + i) for i in range(n)],
        col.TURNS: [None] * n,
    }
    extra = {k: v for k, v in columns.items() if k not in data}
    data.update({k: v for k, v in columns.items() if k in data})
    table = pa.table(data, schema=ROLLOUT_SCHEMA)
    for name, values in extra.items():
        table = table.append_column(name, pa.array(values))
    return table


QA, QB = prompt_id("add", "qA"), prompt_id("add", "qB")


def commit_history(store: RolloutStore) -> None:
    """Step 0: qA rewards 1,0,1,1 (one dropped); qB 0,0,(partial),0.
    Step 1: qA 1, (pruned), and a replayed copy; qB 1, 0."""
    s0 = make_rollouts(8, run_id="r", step=0, group_size=4,
                       rewards=[1.0, 0.0, 1.0, 1.0, 0.0, 0.0, None, 0.0],
                       prompt=["qA"] * 4 + ["qB"] * 4, prompt_id=[QA] * 4 + [QB] * 4,
                       status=["complete"] * 6 + ["partial", "complete"],
                       finish_reason=["stop"] * 6 + ["aborted", "stop"],
                       kept=[True, True, True, False] + [True] * 4,
                       dropped_by=[None, None, None, "length_filter"] + [None] * 4,
                       drop_reason=[None, None, None, "too long"] + [None] * 4)
    s1 = make_rollouts(5, run_id="r", step=1,
                       rewards=[1.0, None, 1.0, 1.0, 0.0],
                       prompt=["qA"] * 3 + ["qB"] * 2, prompt_id=[QA] * 3 + [QB] * 2,
                       group_id=["gA1"] * 3 + ["gB1"] * 2,
                       status=["complete", "pruned", "complete", "complete", "complete"],
                       finish_reason=["stop", "pruned", "stop", "stop", "stop"],
                       parent_id=[None, None, "r/0/0", None, None],
                       replay_count=[0, 0, 1, 0, 0],
                       consumed_at_step=[1, None, 1, 1, 1])
    store.commit_step("r", 0, s0, policy_version=0, metrics={"loss": 1.0})
    store.commit_step("r", 1, s1, policy_version=1, metrics={"loss": 0.5, "kl": 0.01})


@pytest.fixture
def store(tmp_path):
    """A fresh read-write store in a temp folder, closed after the test."""
    with RolloutStore.open(tmp_path / "store") as s:
        yield s
