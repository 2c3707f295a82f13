"""The Episodes stage honours the agentic plan columns: a per-prompt turn cap (``max_turns``,
TurnBudget's) and branches (``branch``, FissionBranch's), whose environment state is
replayed from the stored turns. A real tiny HF engine; a stateful environment."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from gfcr.core.environment import Message, Step
from gfcr.core.rollout import BRANCH, EPISODE_END, PLAN_MAX_TURNS, TURN_COUNT, col
from gfcr.core.trajectory import BRANCH_TYPE
from stages import HF, FissionBranch, TinyLlama
from stages.generate.episodes import Episodes
from stages.replay.fission import error_prefix
from tests.resources.rollouts import context
from tests.stages.generate.test_episodes import plan


class Countdown:
    """Done (reward 1) at its third step; each step before answers with a tool error
    naming how many steps it has seen (its state), reward 0."""

    def __init__(self) -> None:
        self.steps = 0

    def reset(self, task: dict[str, Any]) -> list[Message]:
        return [Message("user", task["prompt"])]

    def step(self, reply: str) -> Step:
        self.steps += 1
        if self.steps >= 3:
            return Step(reward=1.0, done=True)
        return Step([Message("tool", f"err {self.steps}", name="calc")], reward=0.0,
                    tool_name="calc", tool_error=f"E{self.steps}")


ENV = f"{__name__}:Countdown"


def _engine():
    return HF(device="cpu").build(TinyLlama().build(seed=0), seed=0)


def test_a_plan_turn_cap_ends_episodes_at_the_turn_limit():
    p = plan()[:2]
    p = p.append_column(PLAN_MAX_TURNS, pa.array([1, None], pa.int64()))
    stage = Episodes(env=ENV, n=2, max_turns=4, max_tokens=4)
    out = stage.generate(context(), p, _engine(), None).to_pylist()
    assert [(r[TURN_COUNT], r[EPISODE_END]) for r in out] == [
        (1, "turn_limit"), (1, "turn_limit"), (3, "done"), (3, "done")]


def test_a_branch_starts_from_the_stored_turns_with_the_environment_state_replayed():
    engine = _engine()
    stage = Episodes(env=ENV, n=1, max_turns=4, max_tokens=4)
    first = stage.generate(context(), plan()[:1], engine, None).to_pylist()[0]
    prefix = error_prefix(first[col.TURNS])  # prompt, policy turn, tool error "E1"
    p = plan()[:1].append_column("n", pa.array([2], pa.int64())).append_column(
        BRANCH, pa.array([{"parent_id": "parent", "turns": prefix}], BRANCH_TYPE))
    out = stage.generate(context(step=1), p, engine, None).to_pylist()
    assert len(out) == 2
    for row in out:
        assert row[col.PARENT_ID] == "parent"
        assert row[col.TURNS][:3] == prefix and prefix[1]["mask"] == [False] * len(prefix[1]["mask"])
        # the replayed environment had seen one step: done after two more, not three
        assert (row[TURN_COUNT], row[EPISODE_END], row[col.REWARD]) == (2, "done", 1.0)
        assert row[col.TURNS][4]["tool_error"] == "E2"
    assert not FissionBranch().check_pipeline((stage,))
