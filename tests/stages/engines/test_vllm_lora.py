"""The vLLM engine generates with the learner's LoRA adapter (vLLM's CPU build here):
started with ``enable_lora`` because the learner trains one, the base loaded once, each
version's adapter loaded from a peft folder under a new LoRA id; the behaviour logprobs
equal a teacher-forced pass through the learner's adapted model."""

from __future__ import annotations

from pathlib import Path

import torch

from gfcr.core.engine import GenRequest, SamplingParams
from gfcr.runner.inprocess import LocalGenerator, LocalLearner
from stages import GRPO
from stages.engines.hf_sampling import batch_token_logprobs
from stages.train.lora import LoraSpec
from tests.resources.vllm import VLLM_POLICY, vllm_engine_spec
from tests.stages.train.conftest import rollouts

PROMPTS = ["12 + 7 =", "3 + 4 =", "40 - 1 ="]


def _forced(model, prompts, completions) -> list[list[float]]:
    with torch.no_grad():
        lp, _ = batch_token_logprobs(model, prompts, completions)
    return [lp[i, :len(c)].tolist() for i, c in enumerate(completions)]


def _generate(engine) -> tuple[list[list[int]], list[list[int]], list[list[float]]]:
    prompts = [engine.encode_prompt(p) for p in PROMPTS]
    outs = engine.generate([GenRequest(key=i, prompt_ids=p) for i, p in enumerate(prompts)],
                           SamplingParams(temperature=1.0, max_tokens=8, seed=5))
    return prompts, [o.completion_ids for o in outs], [o.logprobs for o in outs]


def _gap(a: list[list[float]], b: list[list[float]]) -> float:
    return max(abs(x - y) for ra, rb in zip(a, b) for x, y in zip(ra, rb))


def test_vllm_generates_with_each_version_of_the_adapter() -> None:
    spec = vllm_engine_spec()
    policy = VLLM_POLICY.build(seed=0)
    learner = LocalLearner(policy, GRPO(lr=5e-2, lora=LoraSpec(r=4, alpha=8.0))
                           .learner(policy, seed=0))
    engine = spec.build(policy, seed=0)  # the learner is built first: vLLM enables LoRA
    generator = LocalGenerator(engine, policy, shared=True)
    batch = rollouts(policy, [1.0, 0.0, 0.0, 1.0], list("aabb"))
    folders: list[tuple[Path, int]] = []
    for version in (2, 3):
        while policy.version < version:
            _, handle = learner.update(None, batch)
        generator.load(handle)
        request = engine.lora_request
        assert request is not None and request.lora_int_id not in [f[1] for f in folders]
        folders.append((Path(request.lora_path), request.lora_int_id))
        prompts, completions, got = _generate(engine)
        assert all(completions)
        assert _gap(_forced(policy.model, prompts, completions), got) < 1e-4
        base = VLLM_POLICY.build(seed=0)  # the adapter matters: the base alone differs
        assert _gap(_forced(base.model, prompts, completions), got) > 1e-3
    assert not folders[0][0].exists() and folders[1][0].is_dir()  # the old one dropped
