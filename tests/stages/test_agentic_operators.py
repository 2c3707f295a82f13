"""The agentic operators in real runs: the agentic pipeline (Episodes against the feedback
environment, HF engine, a tiny policy) with GiGPO or IGPO before GRPO, two steps each,
stored in a real store; the stored turn advantages follow the trajectories' turns, IGPO
reaches the learner's teacher forcing through the loop, and the report and the doctor
read the runs."""

from __future__ import annotations

from typing import Any

import pytest

from gfcr import Pipeline
from gfcr.core.rollout import TURN_ADVANTAGES
from gfcr.doctor import diagnose
from gfcr.launch.run import execute
from gfcr.report import report_html
from pipelines.agentic import pipeline as agentic
from stages import GiGPO, IGPO
from store import RolloutStore
from tests.pipelines.test_agentic import _two_steps


def _with(stage: Any) -> Pipeline:
    data = _two_steps(agentic).to_dict()
    data["stages"].insert(-1, stage.model_dump())
    return Pipeline(**data)


@pytest.mark.parametrize("stage", [GiGPO(gamma=0.9), IGPO(answer_format="{answer}")],
                         ids=["gigpo", "igpo"])
def test_an_agentic_operator_in_a_real_run(tmp_path: Any, stage: Any) -> None:
    run_id = f"agentic-{stage.type}"
    summary = execute(_with(stage), root=tmp_path, executor="local", run_id=run_id)
    assert summary.steps == 2
    with RolloutStore.open(tmp_path / "store", read_only=True) as s:
        rows = s.sql(f"SELECT turns, {TURN_ADVANTAGES}, reward FROM rollouts "
                     f"WHERE run_id = '{run_id}'").to_pylist()
        html = report_html(s, [run_id])
        diagnose(s, run_id)
    assert rows and all(r[TURN_ADVANTAGES] is not None for r in rows)
    for r in rows:
        sources = [t["source"] for t in r["turns"]]
        given = r[TURN_ADVANTAGES]
        assert len(given) == len(sources)
        assert [v is not None for v in given] == [s == "policy" for s in sources]
    if stage.type == "igpo":  # a two-turn episode's first turn earned an information gain
        multi = [r for r in rows if len(r["turns"]) == 4]
        assert multi and all(r["turns"][1]["reward"] is not None for r in multi)
        assert all(r["turns"][3]["reward"] == r["reward"] for r in multi)
    assert ("Sample trajectories" in html) == any(len(r["turns"]) > 3 for r in rows)


def test_fission_branches_and_turn_budgets_in_a_real_run(tmp_path: Any) -> None:
    """Every episode of the Countdown environment fails a tool call first, so step 1
    branches step 0's newest trajectories at their first error; TurnBudget's caps (8
    turns over 2 prompts x 2 episodes: 2 each at step 0) end episodes at the turn limit."""
    from stages import FissionBranch, TurnBudget
    from tests.stages.generate.test_episode_plans import ENV

    data = _two_steps(agentic).to_dict()
    episodes = {**data["stages"][1], "env": ENV, "env_options": {}, "n": 2, "max_turns": 3}
    data["stages"] = [FissionBranch(n=2, max_branches=2).model_dump(), data["stages"][0],
                      TurnBudget(budget=8, split="uniform", max_turns=3).model_dump(),
                      episodes, data["stages"][-1]]
    execute(Pipeline(**data), root=tmp_path, executor="local", run_id="fission")
    with RolloutStore.open(tmp_path / "store", read_only=True) as s:
        rows = s.sql("SELECT step, rollout_id, parent_id, turns, n_turns, episode_end "
                     "FROM rollouts WHERE run_id = 'fission' ORDER BY step").to_pylist()
    first = {r["rollout_id"]: r for r in rows if r["step"] == 0}
    assert len(first) == 4 and all((r["n_turns"], r["episode_end"]) == (2, "turn_limit")
                                   for r in first.values())
    branched = [r for r in rows if r["step"] == 1 and r["parent_id"] is not None]
    assert len(branched) == 2 * 2 and {r["parent_id"] for r in branched} <= set(first)
    for r in branched:
        parent = first[r["parent_id"]]["turns"]
        assert [t["token_ids"] for t in r["turns"][:3]] == [t["token_ids"] for t in parent[:3]]
        assert r["turns"][2]["tool_error"] == "E1" and not any(r["turns"][1]["mask"])
