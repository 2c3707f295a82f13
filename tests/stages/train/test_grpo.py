"""The GRPO learner on a tiny real LlamaForCausalLM: one step, state round trip, logprobs."""

import copy

import numpy as np
import pyarrow as pa
import pytest
import torch
from pydantic import ValidationError

from stages.engines.hf_sampling import batch_token_logprobs
from stages.engines.tiny import TinyLlama
from stages.train.grpo import GRPO, sequence_logprobs

TINY = TinyLlama(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, tokenizer="char")
"""The char vocabulary: the tolerances below were set with its 101 ids."""
PROMPTS = ["State the answer: 1 + 2 =", "State the answer: 13 - 4 =",
           "State the answer: 1 + 2 =", "State the answer: 7 + 7 ="]
COMPLETIONS = ["3", "9", "12", "14"]


def _batch(policy, rewards, groups):
    """Rollout rows whose behaviour logprobs come from the current policy."""
    tok = policy.tokenizer
    n = len(rewards)
    prompts = [tok.encode(PROMPTS[i % 4]) for i in range(n)]
    completions = [tok.encode(COMPLETIONS[i % 4]) + [tok.eos_token_id] for i in range(n)]
    with torch.no_grad():
        lp, mask = batch_token_logprobs(policy.model, prompts, completions)
    logprobs = [lp[i, :len(c)].tolist() for i, c in enumerate(completions)]
    return pa.table({"reward": pa.array(rewards, pa.float64()), "group_id": groups,
                     "prompt_ids": prompts, "completion_ids": completions,
                     "logprobs": logprobs})


REWARDS = [1.0, 0.0, 0.0, 1.0, 0.5, 0.5, 0.5, 0.5]
GROUPS = ["a"] * 4 + ["b"] * 4


def _params(model):
    return [p.detach().clone() for p in model.parameters()]


def test_sequence_logprobs_equal_the_engine_convention():
    model = TINY.build(seed=0).model
    tok = TINY.build(seed=0).tokenizer
    prompts = [tok.encode(p) for p in PROMPTS]
    completions = [tok.encode(c) + [2] for c in COMPLETIONS]
    ref, ref_mask = batch_token_logprobs(model, prompts, completions, 0.7)
    got, mask = sequence_logprobs(model, prompts, completions, 0.7)
    assert torch.equal(mask, ref_mask)
    assert torch.allclose(got, ref, atol=1e-5)
    (ref.sum()).backward()
    ref_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    (got.sum()).backward()
    for a, b in zip(ref_grads, (p.grad for p in model.parameters())):
        assert torch.allclose(a, b, atol=1e-4, rtol=1e-4)


def test_one_step_changes_weights_and_reports_metrics():
    policy = TINY.build(seed=0)
    learner = GRPO(lr=1e-2, micro_batch=3).learner(policy, seed=0)
    before = _params(policy.model)
    result = learner.update(None, _batch(policy, REWARDS, GROUPS))
    assert len(result.advantages) == 8
    assert result.advantages[4:] == [0.0] * 4  # flat group b: no signal, advantage 0
    assert result.advantages[0] > 0 > result.advantages[1]
    assert any(not torch.equal(a, b) for a, b in zip(before, policy.model.parameters()))
    m = result.metrics
    assert set(m) >= {"loss", "clip_frac", "grad_norm", "approx_kl", "reward_mean",
                      "adv_abs_mean", "n_seqs", "n_tokens"}
    assert m["n_seqs"] == 4 and m["n_tokens"] == 2 + 2 + 3 + 3
    assert m["reward_mean"] == pytest.approx(0.5)
    assert m["approx_kl"] == pytest.approx(0.0, abs=1e-6)  # first epoch: ratio 1
    assert m["grad_norm"] > 0


def test_state_dict_round_trip_reproduces_the_next_step():
    policy = TINY.build(seed=0)
    spec = GRPO(lr=1e-2, epochs=2, micro_batch=4)
    learner = spec.learner(policy, seed=0)
    batch = _batch(policy, REWARDS, GROUPS)
    learner.update(None, batch)
    saved = copy.deepcopy(learner.state_dict())
    second = learner.update(None, batch)
    expected = _params(policy.model)

    other = TINY.build(seed=1)  # different weights, replaced by the loaded state
    again = spec.learner(other, seed=0)
    again.load_state_dict(saved)
    replay = again.update(None, batch)
    for a, b in zip(expected, other.model.parameters()):
        assert torch.allclose(a, b, atol=1e-7)
    assert replay.metrics["loss"] == pytest.approx(second.metrics["loss"])
    assert again.state_dict()["updates"] == 2


def test_micro_batching_accumulates_to_the_same_update():
    results = []
    for micro in (1, 8):
        policy = TINY.build(seed=0)
        learner = GRPO(lr=1e-2, micro_batch=micro, aggregation="token_mean").learner(policy, seed=0)
        learner.update(None, _batch(policy, [1.0, 0.0, 0.2, 0.7], ["a", "a", "b", "b"]))
        results.append(_params(policy.model))
    # Adam's first step is lr * g / (|g| + 1e-8): on entries whose gradient is near 1e-8
    # the float noise of another summation order (~1e-8, chunked logits) shows as ~1e-5;
    # a wrong accumulation is off by about lr (1e-2)
    for a, b in zip(*results):
        assert torch.allclose(a, b, atol=5e-5)


def test_all_flat_batch_leaves_weights_alone():
    policy = TINY.build(seed=0)
    before = _params(policy.model)
    result = GRPO().learner(policy, seed=0).update(None, _batch(policy, [1.0] * 4, ["a"] * 4))
    assert result.advantages == [0.0] * 4
    assert result.metrics["n_seqs"] == 0 and result.metrics["loss"] == 0.0
    assert all(torch.equal(a, b) for a, b in zip(before, policy.model.parameters()))


def test_null_reward_and_mismatched_logprobs_raise():
    policy = TINY.build(seed=0)
    learner = GRPO().learner(policy, seed=0)
    batch = _batch(policy, [1.0, 0.0], ["a", "a"])
    nulls = batch.set_column(0, "reward", pa.array([1.0, None], pa.float64()))
    with pytest.raises(ValueError, match="null 'reward'"):
        learner.update(None, nulls)
    short = batch.set_column(4, "logprobs", pa.array([[0.0], [0.0]], pa.list_(pa.float64())))
    with pytest.raises(ValueError, match="row 0 has 2 completion ids but 1 logprobs"):
        learner.update(None, short)


def test_config_is_strict():
    with pytest.raises(ValidationError, match="advantage 'ppo' is not registered"):
        GRPO(advantage="ppo")
    with pytest.raises(ValidationError, match="aggregation"):
        GRPO(aggregation="sum")
    with pytest.raises(ValidationError, match="temperature"):
        GRPO(temperature=0.0)
    with pytest.raises(ValidationError, match="extra"):
        GRPO(kl_coeff=0.1)
    assert GRPO.reads == {"reward", "group_id", "prompt_ids", "completion_ids", "logprobs"}
    assert GRPO.writes == {"advantage"}
    assert np.isfinite(GRPO().lr)


def test_pipeline_refuses_a_train_temperature_other_than_the_sampling_one():
    from gfcr.core.pipeline import PipelineError
    from stages import ConditionedSample, GroupSample, UniformSampler, Verify
    from tests.conftest import tiny_pipeline

    with pytest.raises(PipelineError, match=r"stage 'grpo': field 'temperature' is 1.0 but "
                                            r"generate stage 'group' samples at temperature 0.7"):
        tiny_pipeline(stages=[UniformSampler(batch=2), GroupSample(n=2, temperature=0.7),
                              Verify(), GRPO()])
    with pytest.raises(PipelineError, match=r"set grpo.temperature=0.5"):
        tiny_pipeline(stages=[UniformSampler(batch=2),
                              ConditionedSample(sample=GroupSample(n=2, temperature=0.5)),
                              Verify(), GRPO(temperature=0.7)])
    tiny_pipeline(stages=[UniformSampler(batch=2),
                          ConditionedSample(sample=GroupSample(n=2, temperature=0.5)),
                          Verify(), GRPO(temperature=0.5)])
    tiny_pipeline(stages=[UniformSampler(batch=2), GroupSample(n=2, temperature=0.0),
                          Verify(), GRPO()])  # greedy logprobs are at temperature 1
