"""Hand-built run histories for the replay tests: rows committed to a temp store and read
back through LakeHistory as the loop reads them; a task whose prompts are given texts."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from gfcr.core.rollout import PROMPT_SCHEMA, prompt_id
from gfcr.core.stage import StepContext
from store import LakeHistory
from tests.store.conftest import make_rollouts


class Pool:
    """A task whose training prompts are given texts (task name "add")."""

    def __init__(self, texts: list[str]) -> None:
        self.table = pa.Table.from_pylist(
            [{"prompt_id": prompt_id("add", t), "task": "add", "prompt": t, "answer": "0",
              "meta": None} for t in texts], schema=PROMPT_SCHEMA)

    def train_prompts(self) -> pa.Table:
        return self.table

    def heldout_prompts(self) -> pa.Table:
        return self.table

    def score(self, completion: str, answer: Any, meta: Any) -> float:
        return float(completion.strip() == answer)


def attempts(step: int, outcomes: dict[str, list[float]], *, run_id: str = "r",
             **columns: list[Any]) -> pa.Table:
    """One step's rows: for each prompt text, one group with the given rewards."""
    texts = [t for t, rewards in outcomes.items() for _ in rewards]
    rewards = [r for t in outcomes for r in outcomes[t]]
    groups = [f"{run_id}/{step}/{t}" for t, rs in outcomes.items() for _ in rs]
    samples = [i for rs in outcomes.values() for i in range(len(rs))]
    return make_rollouts(len(texts), run_id=run_id, step=step, rewards=rewards, prompt=texts,
                         prompt_id=[prompt_id("add", t) for t in texts], group_id=groups,
                         sample_idx=samples,
                         rollout_id=[f"{g}/{i}" for g, i in zip(groups, samples)], **columns)


def commit(store: Any, steps: list[pa.Table], *, run_id: str = "r") -> None:
    for step, table in enumerate(steps):
        store.commit_step(run_id, step, table, policy_version=step, metrics={})


def context(store: Any, pool: Pool, step: int, *, run_id: str = "r", seed: int = 0) -> StepContext:
    """The context the loop builds at ``step``: history as of the step before."""
    history = LakeHistory(store, run_id, as_of_step=step - 1) if step else LakeHistory(store, run_id)
    return StepContext(run_id=run_id, step=step, seed=seed, policy_version=step, task=pool,
                       history=history)


def chosen_texts(table: pa.Table) -> list[str]:
    return table.column("prompt").to_pylist()


def empty() -> pa.Table:
    return PROMPT_SCHEMA.empty_table()
