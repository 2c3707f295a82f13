"""The learner follows the model's device and dtype (issue 33): built before the engine
places the model, or with the model moved or cast after it exists, an update runs where
the weights are and in their dtype. On a GPU machine the first update failed with
"Expected all tensors to be on the same device" because the learner kept the CPU it was
built on; on CPU the same class of bug shows with a dtype cast or a model that starts on
torch's "meta" device and is materialised after the learner is built."""

from __future__ import annotations

import pytest
import torch

from stages.logprobs import CHUNK_TOKENS, chunk_size, completion_scores
from stages.train.batching import plan, waste
from stages.train.device import move_state
from stages.train.grpo import GRPO

from .conftest import TINY, params, rollouts

REWARDS, GROUPS = [1.0, 0.0, 0.5, 0.2], ["a", "a", "b", "b"]


def _moments(learner) -> list[torch.Tensor]:
    return [s["exp_avg"] for s in learner.optimizer.state.values()]


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_a_model_cast_after_the_learner_exists_trains_in_its_new_dtype(policy, dtype):
    learner = GRPO(lr=1e-2).learner(policy, seed=0)
    policy.model.to(dtype)  # what an engine placing the model does, after the learner
    batch = rollouts(policy, REWARDS, GROUPS)
    before = params(policy.model)
    result = learner.update(None, batch)
    assert result.metrics["n_seqs"] == 4 and result.metrics["grad_norm"] > 0
    assert all(p.dtype == dtype for p in policy.model.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(before, policy.model.parameters()))
    assert {m.dtype for m in _moments(learner)} == {dtype}


def test_a_cast_between_updates_carries_the_optimizer_state(policy):
    learner = GRPO(lr=1e-2).learner(policy, seed=0)
    batch = rollouts(policy, REWARDS, GROUPS)
    learner.update(None, batch)
    first = [m.clone() for m in _moments(learner)]
    policy.model.to(torch.float64)
    learner.update(None, rollouts(policy, REWARDS, GROUPS))
    steps = [float(s["step"]) for s in learner.optimizer.state.values()]
    assert steps and set(steps) == {2.0}  # the moments went on, not restarted
    assert {m.dtype for m in _moments(learner)} == {torch.float64}
    assert any(not torch.allclose(a.double(), b) for a, b in zip(first, _moments(learner)))


def test_a_learner_built_before_the_model_is_placed_trains_where_it_lands():
    """The engine's order on a GPU: the learner sees the model somewhere else (here
    torch's "meta" device, with no storage at all), then the model is placed."""
    policy = TINY.build(seed=0)
    weights = {k: v.clone() for k, v in policy.model.state_dict().items()}
    # non-persistent buffers (rotary inv_freq) are not in the state dict: to_empty leaves
    # them uninitialised memory (NaN at random), so they are put back by hand
    buffers = {k: v.clone() for k, v in policy.model.named_buffers()}
    policy.model.to("meta")
    learner = GRPO(lr=1e-2).learner(policy, seed=0)
    assert learner.device.type == "meta"
    policy.model.to_empty(device="cpu")
    policy.model.load_state_dict(weights)
    for name, value in buffers.items():
        if name not in weights:
            module, _, attr = name.rpartition(".")
            policy.model.get_submodule(module).register_buffer(attr, value, persistent=False)
    policy.model.tie_weights()
    result = learner.update(None, rollouts(policy, REWARDS, GROUPS))
    assert learner.device == torch.device("cpu")
    assert result.metrics["grad_norm"] > 0 and result.metrics["peak_memory_mb"] > 0
    assert {m.device.type for m in _moments(learner)} == {"cpu"}


def test_offloaded_optimizer_state_trains_like_resident_state():
    results = []
    for offload in (False, True):
        policy = TINY.build(seed=0)
        learner = GRPO(lr=1e-2, offload_optimizer=offload).learner(policy, seed=0)
        for _ in range(2):
            learner.update(None, rollouts(policy, REWARDS, GROUPS))
        results.append(params(policy.model))
    for a, b in zip(*results):
        assert torch.equal(a, b)


def test_move_state_sends_moments_away_and_back_beside_their_weights():
    weight = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.AdamW([weight], lr=0.1)
    weight.grad = torch.ones(3)
    opt.step()
    move_state(opt, torch.device("meta"))  # stands in for "elsewhere" on a CPU machine
    assert {v.device.type for v in opt.state[weight].values()} == {"meta"}
    # back beside a weight that lives elsewhere (meta): the moments follow, AdamW's
    # unfused step counter stays on the CPU
    far = torch.nn.Parameter(torch.ones(3, device="meta"))
    other = torch.optim.AdamW([far], lr=0.1)
    other.state[far] = {"step": torch.tensor(1.0), "exp_avg": torch.zeros(3),
                        "exp_avg_sq": torch.zeros(3)}
    move_state(other, None)
    state = other.state[far]
    assert state["exp_avg"].is_meta and state["exp_avg_sq"].is_meta
    assert state["step"].device.type == "cpu"


def test_micro_batches_sort_by_length_unless_groups_save_a_long_prompt():
    # two groups of short prompts, completions of very different lengths: sorted wins
    prompts = [[1, 2, 3]] * 4 + [[4, 5, 6]] * 4
    completions = [[7] * n for n in (2, 40, 3, 41, 2, 40, 3, 42)]
    runs = plan(prompts, completions, max_rows=4)
    assert sorted(i for run in runs for i in run) == list(range(8))
    assert waste(prompts, completions, runs) < 0.05
    kept = [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert waste(prompts, completions, kept) > 0.4
    # long shared prompts: the groups stay together, each prompt runs once
    long = [[9] * 200 + [1]] * 4 + [[8] * 200 + [2]] * 4
    assert sorted(map(sorted, plan(long, completions, max_rows=4))) == kept


def test_the_update_reports_its_packing_waste(policy):
    result = GRPO(lr=1e-2, micro_batch=2).learner(policy, seed=0).update(
        None, rollouts(policy, REWARDS, GROUPS))
    assert 0.0 <= result.metrics["packing_waste"] < 1.0


def test_the_logprob_head_chunk_is_sized_by_device_and_vocabulary():
    assert chunk_size(torch.device("cpu"), 49_152) == 341
    assert chunk_size(torch.device("cuda"), 49_152) == 5461
    assert chunk_size(torch.device("cpu"), 10**9) == CHUNK_TOKENS
    model = TINY.build(seed=0).model
    prompts, completions = [[1, 2, 3], [1, 2, 4, 5]], [[6, 7, 8], [9]]
    whole, _, _ = completion_scores(model, prompts, completions)  # one chunk
    chunked, _, _ = completion_scores(model, prompts, completions, chunk_tokens=1)
    assert torch.allclose(whole, chunked, atol=1e-6)
