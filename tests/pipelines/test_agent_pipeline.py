"""The ``agent`` ready pipeline: an openai-client agent (examples/agent_calculator.py)
generates and scores, GRPO trains on its trajectories; two steps on the HF engine."""

from __future__ import annotations

from gfcr import Pipeline
from gfcr.launch.run import execute
from pipelines.agent import pipeline as agent_pipeline
from stages import AgentEnv
from store import RolloutStore
from tests.pipelines.test_pipelines import _shrunk
from tests.resources.agents import needs_openai

needs_openai()


def test_agent_pipeline_round_trips_through_yaml():
    p = agent_pipeline
    assert Pipeline.from_yaml(p.to_yaml()).spec_hash() == p.spec_hash()
    assert p.stage("agent").agent == "examples.agent_calculator:solve"


def test_agent_pipeline_trains_two_steps_on_its_agents_rewards(tmp_path):
    data = _shrunk(agent_pipeline).to_dict()
    data["stages"][1]["n"], data["steps"] = 3, 2
    data["policy"]["max_position"] = 1024  # the tools and a few turns
    p = Pipeline(**data)
    assert isinstance(p.stages[1], AgentEnv) and not p.of_kind("filter")
    summary = execute(p, root=tmp_path, executor="local")
    assert summary.steps == 2
    with RolloutStore.open(tmp_path / "store", read_only=True) as s:
        rows = s.sql(f"SELECT step, reward, score_error, turns, consumed_at_step, "
                     f"prompt_ids, completion_ids FROM rollouts "
                     f"WHERE run_id = '{summary.run_id}' ORDER BY step").to_pylist()
    assert [r["step"] for r in rows] == [0] * 6 + [1] * 6
    assert all(r["score_error"] is None and r["reward"] in (0.0, 1.0) for r in rows)
    assert all(r["consumed_at_step"] == r["step"] for r in rows)  # the learner took them
    for r in rows:
        turns = r["turns"]
        assert turns[0]["source"] == "environment" and turns[1]["source"] == "policy"
        assert [t for turn in turns[1:] for t in turn["token_ids"]] == r["completion_ids"]
        assert turns[0]["token_ids"] == r["prompt_ids"]
