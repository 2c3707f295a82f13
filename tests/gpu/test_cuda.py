"""gfcr on a GPU (issue 33): each engine, the learner in fp32 and bf16, LoRA, a two-step
run end to end, and checkpoint and resume, all on CUDA. Marked ``gpu`` and skipped where
torch sees no CUDA device, so CI (CPU) never runs them; scripts/gpu-check.sh runs them on
a lent GPU (``pytest -m gpu``).

The learner is built before the engine places the model in every test here: the order
gfcr's runner uses (gfcr.launch.placement), and the one that failed on the first GPU run
("Expected all tensors to be on the same device").
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from gfcr.core.engine import GenRequest, SamplingParams
from gfcr.launch.run import execute
from stages import GRPO, HF, DynamicSampling, GroupSample, UniformSampler, Verify
from stages.train.lora import LoraSpec
from tests.conftest import tiny_pipeline
from tests.resources.digits import Digits
from tests.stages.train.conftest import TINY, params, rollouts

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
REWARDS, GROUPS = [1.0, 0.0, 0.5, 0.2], ["a", "a", "b", "b"]


def _on_cuda(module: torch.nn.Module) -> bool:
    return all(p.device.type == "cuda" for p in module.parameters())


def test_hf_engine_generates_on_cuda_with_the_trainers_logprobs():
    from stages.engines.hf_sampling import batch_token_logprobs

    policy = TINY.build(seed=0)
    engine = HF(device="cuda").build(policy, seed=0)
    assert _on_cuda(policy.model) and engine.sleep_mode
    prompt = engine.encode("1+2=")
    out = engine.generate([GenRequest(key=i, prompt_ids=prompt) for i in range(4)],
                          SamplingParams(max_tokens=6))
    engine.sleep()
    engine.wake_up()
    for o in out:
        lp, _ = batch_token_logprobs(policy.model, [prompt], [o.completion_ids])
        assert torch.allclose(lp[0, :len(o.completion_ids)].cpu(),
                              torch.tensor(o.logprobs), atol=1e-3)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vLLM")
def test_vllm_engine_colocated_sleeps_wakes_and_syncs_weights():
    from stages import VLLM

    policy = TINY.build(seed=0)
    learner = GRPO(lr=1e-2).learner(policy, seed=0)
    engine = VLLM(dtype="float32", max_model_len=256).build(policy, seed=0)
    assert _on_cuda(policy.model) and engine.sleep_mode  # colocated by default on a GPU
    prompt = engine.encode("1+2=")
    first = engine.generate([GenRequest(key=0, prompt_ids=prompt)], SamplingParams(max_tokens=4))
    engine.sleep()
    learner.update(None, rollouts(policy, REWARDS, GROUPS))
    engine.wake_up()
    assert engine.update_weights() == 1
    again = engine.generate([GenRequest(key=0, prompt_ids=prompt)], SamplingParams(max_tokens=4))
    assert first[0].completion_ids and again[0].version == 1


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_learner_built_before_the_engine_trains_on_cuda(precision):
    policy = TINY.build(seed=0)
    learner = GRPO(lr=1e-2, precision=precision).learner(policy, seed=0)
    HF(device="cuda").build(policy, seed=0)  # moves the model after the learner exists
    batch = rollouts(policy, REWARDS, GROUPS)
    before = params(policy.model)
    result = learner.update(None, batch)
    assert learner.device.type == "cuda" and _on_cuda(policy.model)
    assert any(not torch.equal(a, b) for a, b in zip(before, policy.model.parameters()))
    assert learner.optimizer.param_groups[0]["fused"]  # torch's fused AdamW on CUDA
    assert 0 < result.metrics["peak_memory_mb"] < torch.cuda.get_device_properties(0).total_memory
    learner.update(None, batch)  # a second update: the fused state stays where it is


def test_offloaded_optimizer_state_leaves_the_gpu_between_updates():
    policy = TINY.build(seed=0)
    learner = GRPO(lr=1e-2, offload_optimizer=True).learner(policy, seed=0)
    HF(device="cuda").build(policy, seed=0)
    for _ in range(2):
        learner.update(None, rollouts(policy, REWARDS, GROUPS))
        moments = [s["exp_avg"] for s in learner.optimizer.state.values()]
        assert moments and all(m.device.type == "cpu" for m in moments)


def test_lora_trains_its_adapter_on_cuda():
    policy = TINY.build(seed=0)
    learner = GRPO(lr=1e-2, lora=LoraSpec(r=4, alpha=8)).learner(policy, seed=0)
    HF(device="cuda").build(policy, seed=0)
    result = learner.update(None, rollouts(policy, REWARDS, GROUPS))
    assert result.metrics["grad_norm"] > 0
    trained = [p for g in learner.optimizer.param_groups for p in g["params"]]
    assert trained and all(p.device.type == "cuda" for p in trained)


def _run(steps: int):
    """test_resume's pipeline (Digits: it learns from the first step) on CUDA."""
    return tiny_pipeline(task=Digits(), steps=steps, engine=HF(device="cuda"), stages=[
        UniformSampler(batch=4), GroupSample(n=4, max_tokens=4), Verify(), DynamicSampling(),
        GRPO(lr=1e-2)])


def test_a_two_step_run_trains_and_resumes_on_cuda(tmp_path):
    first = execute(_run(2), root=tmp_path, executor="local", run_id="g")
    assert first.steps == 2 and first.history[-1]["policy_version"] == 2
    assert first.history[-1]["train/peak_memory_mb"] > 0
    again = execute(_run(3), root=tmp_path, executor="local", run_id="g")
    assert again.resumed_from == 1 and len(again.history) == 3
    assert again.history[-1]["policy_version"] == 3
