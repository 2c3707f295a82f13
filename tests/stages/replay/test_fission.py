"""Fission-GRPO-style branches at tool errors (stages.replay.fission), read from a real
store: which failed trajectories are branched, and the plan rows that start from them."""

import pyarrow as pa

from gfcr.core.rollout import BRANCH, PROMPT_SCHEMA, stable_id
from stages import FissionBranch, GroupSample
from store import LakeHistory, RolloutStore
from tests.resources.agentic import PROMPT, committed_run, episodes, turn
from tests.resources.rollouts import context

ERR = "NameError: name 'x' is not defined"


def _trajectory(error=None):
    return [turn("environment", PROMPT), turn("policy", [5, 6]),
            turn("tool", [7], tool_name="python", tool_error=error),
            turn("policy", [8, 9], reward=1.0)]


def _store(tmp_path):
    """Step 0 of run "agent": 0 failed on a tool, 1 did not, 2 failed but row 3 already
    branches from it, 4 failed but is not scored (no attempt)."""
    rows = episodes([_trajectory(ERR), _trajectory(), _trajectory(ERR), _trajectory(),
                     _trajectory(ERR)], rewards=[0.0, 1.0, 0.0, 1.0, None],
                    parent_id=[None, None, None, "agent/0/2", None])
    s = RolloutStore.open(tmp_path / "store")
    committed_run(s, "agent", [rows])
    return s


def test_a_failed_trajectory_is_branched_at_its_tool_error(tmp_path):
    with _store(tmp_path) as s:
        ctx = context(step=1, history=LakeHistory(s, "agent", as_of_step=0))
        plan = FissionBranch(n=3).select(ctx, PROMPT_SCHEMA.empty_table())
        later = FissionBranch(window=1).select(context(step=3, history=ctx.history),
                                                PROMPT_SCHEMA.empty_table())
    assert plan.num_rows == 1 and later.num_rows == 0
    row = plan.to_pylist()[0]
    assert row["n"] == 3 and row["group_id"] == stable_id("agent/0/0", "fission")
    branch = row[BRANCH]
    assert branch["parent_id"] == "agent/0/0"
    assert [t["source"] for t in branch["turns"]] == ["environment", "policy", "tool"]
    assert branch["turns"][2]["tool_error"] == ERR
    assert branch["turns"][1]["mask"] == [False, False]          # out of the loss
    assert branch["turns"][1]["logprobs"] == [-0.5, -0.5]         # kept as generated


def test_fresh_prompts_follow_the_branches_and_step_0_branches_nothing(tmp_path):
    fresh = pa.Table.from_pylist([{"prompt_id": "p", "task": "t", "prompt": "q",
                                   "answer": "1", "meta": None}], schema=PROMPT_SCHEMA)
    with _store(tmp_path) as s:
        history = LakeHistory(s, "agent", as_of_step=0)
        plan = FissionBranch().select(context(step=1, history=history), fresh)
        first = FissionBranch().select(context(step=0, history=history), fresh)
    assert plan.column("prompt_id").to_pylist()[1] == "p" and plan.column(BRANCH)[1].as_py() is None
    assert first.num_rows == 1 and first.column(BRANCH).null_count == 1


def test_a_generate_stage_that_cannot_continue_branches_is_named():
    problems = FissionBranch().check_pipeline((GroupSample(n=2),))
    assert len(problems) == 1 and "does not declare continues_branches" in problems[0]
