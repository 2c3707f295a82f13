"""The agentic generate stages on a fleet of vLLM's own servers (gfcr.transport.fleet): the
suite's two real vLLM CPU servers (tests/conftest.py ``fleet_servers``), no vLLM in this
process. Every turn-wave is one fleet call, split by group across both servers; each
row's policy tokens are checked against a teacher-forced pass of the published version
it names (the fleet's sampling is not the in-process engine's, as in test_fleet)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gfcr.launch.placement import Placement
from gfcr import Pipeline
from gfcr.core.trajectory import loss_mask
from gfcr.launch.run import execute
from gfcr.weights.versions import WeightStore, directory
from gfcr.transport.fleet import Fleet
from pipelines.agentic import pipeline as agentic
from stages import GRPO, AgentEnv, Episodes, TinyLlama, UniformSampler
from stages.engines import teacher
from store import RolloutStore
from tests.conftest import tiny_pipeline
from tests.pipelines.test_agentic import _check_store, _two_steps
from tests.resources import fleet as servers
from tests.resources.agents import follow_up_reward, needs_openai
from tests.resources.vllm import VLLM_POLICY, vllm_engine_spec


@pytest.fixture(scope="module")
def fleet(fleet_servers: list[servers.Started]) -> list[servers.Started]:
    return servers.revive(fleet_servers)  # the suite's two servers


def _rows(root: Path, run_id: str) -> list[dict[str, Any]]:
    with RolloutStore.open(root / "store", read_only=True) as s:
        return s.sql(f"SELECT * FROM rollouts WHERE run_id = '{run_id}' "
                     f"ORDER BY step, rollout_id").to_pylist()


def _check_token_exact(root: Path, run_id: str, rows: list[dict[str, Any]]) -> int:
    """Each row's policy tokens have the logprobs of a teacher-forced pass of the version
    that sampled them (the environment's and tools' tokens are out of the loss, 0);
    returns the policy turns checked."""
    policy = VLLM_POLICY.build(seed=0)
    assert policy.io is not None
    store = WeightStore(directory(root, run_id), policy.io)
    turns = 0
    for r in rows:
        assert r["policy_version_start"] == r["policy_version_end"]  # one version a row
        store.load(policy.model, r["policy_version_end"])
        mask = np.array(loss_mask(r["turns"]))
        forced = np.array(teacher.forced_logprobs(policy, r["prompt_ids"],
                                                  r["completion_ids"], 1.0))
        logprobs = np.array(r["logprobs"])
        assert mask.any() and np.allclose(forced[mask], logprobs[mask], atol=2e-4)
        assert not logprobs[~mask].any()
        turns += sum(t["source"] == "policy" for t in r["turns"])
    return turns


def test_agentic_episodes_run_two_steps_on_the_fleet_token_exact(
        tmp_path: Path, fleet: list[servers.Started]) -> None:
    urls = {s.url for s in fleet}
    data: dict[str, Any] = _two_steps(agentic).to_dict()
    data["policy"] = VLLM_POLICY.model_dump()
    data["engine"] = vllm_engine_spec().model_dump()
    summary = execute(Pipeline(**data), root=tmp_path, executor="local", run_id="ep-fleet",
                      placement=Placement(generator=Fleet(urls=tuple(sorted(urls)), keep=5)))
    assert summary.steps == 2
    _check_store(tmp_path, "ep-fleet")  # 2 x 2 tasks x 8 episodes, with their turns
    rows = _rows(tmp_path, "ep-fleet")
    assert len({r["rollout_id"] for r in rows}) == len(rows) == 32  # each stored once
    assert {r["server"] for r in rows} == urls  # split across both servers
    versions = [r["policy_version_end"] for r in rows]
    assert versions == sorted(versions) and versions[-1] >= 1  # step 1 after an update
    for step in (0, 1):  # a task's episodes share a server (its group)
        groups: dict[str, set[str]] = {}
        for r in rows:
            if r["step"] == step and r["n_turns"] == 1:
                groups.setdefault(r["group_id"], set()).add(r["server"])
        assert all(len(s) == 1 for s in groups.values())
    assert _check_token_exact(tmp_path, "ep-fleet", rows) > len(rows)  # multi-turn rows
    assert summary.history[-1]["fleet/servers_live"] == 2.0


def _agent_pipeline(policy: Any, agent: str) -> Pipeline:
    """One step of AgentEnv (two tasks, two episodes each) on the fleet's vLLM engine."""
    return tiny_pipeline(
        steps=1, policy=policy, engine=vllm_engine_spec(),
        stages=[UniformSampler(batch=2),
                AgentEnv(agent=f"tests.resources.agents:{agent}", n=2, max_tokens=4,
                         window=5.0),
                GRPO(lr=1e-2)]
    ).with_overrides(["evaluation.size=4", "evaluation.max_tokens=4"])


def test_agent_env_serves_an_openai_client_agent_from_the_fleet(
        tmp_path: Path, fleet: list[servers.Started]) -> None:
    needs_openai()
    urls = {s.url for s in fleet}
    p = _agent_pipeline(VLLM_POLICY, "follow_up")
    summary = execute(p, root=tmp_path, executor="local", run_id="agent-fleet",
                      placement=Placement(generator=Fleet(urls=tuple(sorted(urls)))))
    assert summary.steps == 1
    rows = _rows(tmp_path, "agent-fleet")
    assert len(rows) == 4 and len({r["rollout_id"] for r in rows}) == 4
    for r in rows:
        assert r["score_error"] is None
        assert r["reward"] == pytest.approx(follow_up_reward(r["prompt"]))
        assert [t["source"] for t in r["turns"]] == ["environment", "policy",
                                                     "environment", "policy"]
        assert r["prompt_ids"] == r["turns"][0]["token_ids"]
        assert r["completion_ids"] == [i for t in r["turns"][1:] for i in t["token_ids"]]
        assert r["policy_version_end"] == 0 and r["server"] in urls
    assert {r["server"] for r in rows} == urls  # the two tasks, one on each server
    assert _check_token_exact(tmp_path, "agent-fleet", rows) == 8


def test_a_turn_the_servers_refuse_fails_the_run_naming_the_stage_and_the_fleet(
        tmp_path: Path, fleet: list[servers.Started]) -> None:
    # the servers' context (--max-model-len 256) is shorter than this turn's cap
    p = tiny_pipeline(
        steps=1, policy=VLLM_POLICY, engine=vllm_engine_spec(),
        stages=[UniformSampler(batch=1),
                Episodes(env="feedback", n=2, max_turns=2, max_tokens=240,
                         max_episode_tokens=240),
                GRPO(lr=1e-2)])
    with pytest.raises(ValueError, match="the fleet refused request .* of stage 'episodes' "
                                         "at step 0: vLLM server http://.*HTTP 400"):
        execute(p, root=tmp_path, executor="local",
                placement=Placement(generator=Fleet(urls=tuple(s.url for s in fleet))))


def test_an_overlong_conversation_on_a_fleet_fails_only_itself(
        tmp_path: Path, fleet: list[servers.Started]) -> None:
    """Drill A9: one episode's call is longer than the servers' --max-model-len (256);
    the policy's own context (512) lets it through to a server, whose HTTP 400 fails
    that call alone: the other episodes are answered and the step is stored."""
    needs_openai()
    from tests.resources import agents

    agents.reset_one_long()
    policy = TinyLlama(hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128,
                       max_position=512)  # VLLM_POLICY's weights, a longer context
    p = _agent_pipeline(policy, "one_long")
    summary = execute(p, root=tmp_path, executor="local", run_id="agent-long",
                      placement=Placement(generator=Fleet(urls=tuple(s.url for s in fleet))))
    assert summary.steps == 1
    rows = _rows(tmp_path, "agent-long")
    errors = [r["score_error"] for r in rows if r["score_error"] is not None]
    assert len(errors) == 1 and "HTTP 400" in errors[0] and "256" in errors[0]
    answered = [r for r in rows if r["score_error"] is None]
    assert len(answered) >= 3 and all(r["reward"] == 1.0 for r in answered)
