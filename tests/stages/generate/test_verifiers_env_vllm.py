"""VerifiersEnv on the vLLM engine (its CPU build here): a multi-turn environment's rows
are vLLM's ids with logprobs equal to a teacher-forced pass and the rubric's rewards, and
the single-turn, multi-turn and tool environments each train two steps. The module shares
one started ``vllm.LLM`` (tests.resources.vllm.LLMPool)."""

from __future__ import annotations

from typing import Any

import pytest

from stages.engines.hf_sampling import token_logprobs
from tests.resources.agents import Recording
from tests.resources.verifiers import needs_verifiers
from tests.resources.vllm import VLLM_POLICY, llm_pool, shared_llms, vllm_engine_spec

needs_verifiers()

from tests.stages.generate.test_verifiers_env import (  # noqa: E402
    _check, _generate, episodes, pipeline, trained_two_steps)

POLICY = VLLM_POLICY.model_copy(update={"max_position": 1024})  # the tool's declaration
__all__ = ["episodes", "llm_pool", "shared_llms"]  # the fixtures, used here


def test_a_multi_turn_environment_on_vllm_is_token_exact(episodes: list[Any]) -> None:
    policy = POLICY.build(seed=0)
    engine = Recording(vllm_engine_spec().build(policy, seed=0))
    rows, stage = _generate("multi", engine, tasks=3)
    generated = sorted(o.completion_ids for _, _, outs in engine.calls for o in outs)
    assert sorted(t["token_ids"] for r in rows for t in r["turns"]
                  if t["source"] == "policy") == generated

    def forced(prompt: list[int], ids: list[int]) -> list[float]:
        return token_logprobs(policy.model, prompt, ids, 1.0).float().tolist()

    _check(rows, stage, engine, episodes, forced)


@pytest.mark.parametrize("module", ["single", "multi", "tools"])
def test_an_environment_trains_two_steps_on_vllm(module: str, tmp_path: Any) -> None:
    trained_two_steps(pipeline(module, POLICY, vllm_engine_spec()), tmp_path)
