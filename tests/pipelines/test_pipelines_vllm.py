"""Every ready pipeline runs shrunk steps on the vLLM engine (vLLM's CPU build here),
unchanged but for the engine and a policy shape vLLM's CPU attention runs (head size 32),
and stores the golden rows (tests.pipelines.golden).

The tests share started ``vllm.LLM`` objects (tests.resources.vllm.LLMPool): every run
here has the same engine configuration, so the module starts one LLM and each later run
loads its own policy's weights into it in place; a test below checks that a reused LLM
generates from the new weights."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from gfcr import Pipeline
from gfcr.core.loading import load
from gfcr.launch.run import execute
from tests.pipelines import golden
from tests.pipelines.test_pipelines import HEADLINES, NEEDS_SOURCE, _shrunk
from gfcr.core.engine import GenRequest, SamplingParams
from stages.engines.hf_sampling import token_logprobs
from tests.resources.vllm import VLLM_POLICY, LLMPool, vllm_engine_spec
from tests.resources.vllm import llm_pool, shared_llms  # noqa: F401 (the fixtures)


def _on_vllm(p: Pipeline) -> Pipeline:
    data: dict[str, Any] = _shrunk(p).to_dict()
    data["policy"] = VLLM_POLICY.model_dump()
    data["engine"] = vllm_engine_spec().model_dump()
    return Pipeline(**data)


TOO_LONG = {"smol-long"}
"""Pipelines whose prompts (400+ bytes of sorting instructions in the tiny policy's byte
tokens) exceed the pooled engines' 256-token context; their vLLM path is bench/real_long.py's."""


@pytest.mark.parametrize("name", ["default", *sorted(set(HEADLINES) - NEEDS_SOURCE - TOO_LONG)])
def test_ready_pipeline_stores_the_golden_rows_on_vllm(name: str, tmp_path: Any) -> None:
    summary = execute(_on_vllm(load(name)), root=tmp_path, executor="local",
                      run_id=golden.RUN_ID)
    assert summary.steps == golden.STEPS and summary.rollouts > 0
    golden.check("vllm", name, tmp_path / "store")


def test_cross_run_pipeline_runs_a_step_on_vllm(tmp_path: Any) -> None:
    from store import RolloutStore
    from tests.store.conftest import make_rollouts

    with RolloutStore.open(tmp_path / "source") as source:
        source.commit_step("earlier", 0, make_rollouts(8, run_id="earlier"), policy_version=3,
                           metrics={})
    p = _on_vllm(load("cross_run")).with_overrides(
        [f"cross_run_replay.source={tmp_path / 'source'}"])
    summary = execute(p, root=tmp_path / "run", executor="local", run_id=golden.RUN_ID)
    assert summary.steps == golden.STEPS and summary.history[0]["replay/rows"] == 8
    golden.check("vllm", "cross_run", tmp_path / "run" / "store")


def test_engine_can_be_chosen_from_the_command_line_spelling() -> None:
    p = load("default").with_overrides(["engine=vllm"])
    assert p.engine.type == "vllm" and p.engine.model_dump()["dtype"] == "float32"


def test_a_reused_llm_generates_from_the_new_policy(llm_pool: LLMPool) -> None:
    spec = vllm_engine_spec()
    first = spec.build(VLLM_POLICY.build(seed=0), seed=0)
    prompt = first.encode("1+1=")
    first.generate([GenRequest(key=0, prompt_ids=prompt)], SamplingParams(max_tokens=8))
    started = llm_pool.started
    llm_pool.release()
    policy = VLLM_POLICY.build(seed=1)
    with torch.no_grad():  # weights far from the first policy's, so a stale model shows
        for p in policy.model.parameters():
            p.mul_(3.0)
    second = spec.build(policy, seed=1)
    assert llm_pool.started == started and second.llm is first.llm
    out = second.generate([GenRequest(key=0, prompt_ids=prompt)],
                          SamplingParams(max_tokens=8, seed=3))[0]
    want = token_logprobs(policy.model, prompt, out.completion_ids, 1.0)
    stale = token_logprobs(first.policy.model, prompt, out.completion_ids, 1.0)
    assert torch.allclose(torch.tensor(out.logprobs), want.float(), atol=1e-4)
    assert not torch.allclose(torch.tensor(out.logprobs), stale.float(), atol=1e-2)


def test_sleep_mode_runs_on_the_cpu_build(tmp_path: Any, llm_pool: LLMPool) -> None:
    """vLLM's CPU build has no sleep mode: the engine starts without it and the loop's
    sleep and wake-up calls around each update do nothing, so the same pipeline runs."""
    from gfcr.core.capabilities import EngineSleep

    spec = vllm_engine_spec().model_copy(update={"sleep_mode": True})
    engine = spec.build(VLLM_POLICY.build(seed=0), seed=0)
    declares = isinstance(engine, EngineSleep)  # (not narrowing: generate is used below)
    assert declares and engine.sleep_mode
    engine.sleep()
    engine.wake_up()
    assert engine.generate([GenRequest(key=0, prompt_ids=engine.encode("1+1="))],
                           SamplingParams(max_tokens=4))[0].completion_ids
    llm_pool.release()  # the run below builds its own engine
    data: dict[str, Any] = _on_vllm(load("default")).to_dict()
    data.update(engine=spec.model_dump(), steps=1)
    summary = execute(Pipeline(**data), root=tmp_path, executor="local")
    assert summary.steps == 1 and summary.rollouts > 0


def test_agent_env_serves_an_openai_client_agent_from_vllm(tmp_path: Any) -> None:
    """The AgentEnv endpoint over the vLLM engine: each policy turn is vLLM's ids with
    logprobs equal to a teacher-forced pass; then the agent pipeline trains two steps."""
    from gfcr.core.rollout import conform
    from gfcr.core.trajectory import loss_mask
    from pipelines.agent import pipeline as agent_pipeline
    from stages import AgentEnv
    from tests.resources.agents import Recording, needs_openai, plan
    from tests.resources.rollouts import context

    needs_openai()
    policy = VLLM_POLICY.build(seed=0)
    engine = Recording(vllm_engine_spec().build(policy, seed=0))
    stage = AgentEnv(agent="tests.resources.agents:three_turns", n=2, max_tokens=6, window=5.0)
    rows = conform(stage.generate(context(), plan("1+2=", "7*8="), engine, None)).to_pylist()
    assert [len(requests) for requests, _, _ in engine.calls] == [4, 4, 4]
    generated = sorted(o.completion_ids for _, _, outs in engine.calls for o in outs)
    assert sorted(t["token_ids"] for r in rows for t in r["turns"]
                  if t["source"] == "policy") == generated
    for row in rows:
        mask = loss_mask(row["turns"])
        want = token_logprobs(policy.model, row["prompt_ids"], row["completion_ids"], 1.0)
        got = torch.tensor(row["logprobs"])
        assert torch.allclose(got[torch.tensor(mask)], want.float()[torch.tensor(mask)],
                              atol=1e-4)
    data: dict[str, Any] = _on_vllm(agent_pipeline).to_dict()
    data["steps"], data["policy"]["max_position"] = 2, 1024  # the tools and a few turns
    summary = execute(Pipeline(**data), root=tmp_path, executor="local")
    assert summary.steps == 2 and summary.rollouts > 0
