"""Checkpoints: a round trip restores weights, learner and RNG states; a write that did
not finish is ignored; only the newest ``keep`` stay."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from gfcr.checkpoints import checkpoint
from gfcr.checkpoints.checkpoint import CheckpointError
from gfcr.runner.inprocess import LocalLearner
from stages import GRPO, HF, TinyLlama


def _live(seed=0):
    policy = TinyLlama(hidden_size=32, num_layers=1, num_heads=2,
                       intermediate_size=64).build(seed=seed)
    engine = HF(device="cpu").build(policy, seed=seed)
    return policy, engine, GRPO(lr=1e-2).learner(policy, seed=seed)


def _train_a_little(policy, learner):
    """Move weights and optimizer state off their initial values."""
    ids = torch.tensor([[1, 2, 3, 4]])
    for _ in range(2):
        learner.optimizer.zero_grad()
        policy.model(input_ids=ids).logits.sum().backward()
        learner.optimizer.step()
    learner.updates += 2
    policy.version += 2


def _save(where, policy, engine, learner, step, keep=2):
    return checkpoint.save(where, run_id="r", step=step, spec_hash="abc", policy=policy,
                           learner=LocalLearner(policy, learner), engine=engine, progress={"history": [{"x": 1.0}]},
                           keep=keep)


def test_round_trip_restores_weights_learner_and_rngs(tmp_path):
    policy, engine, learner = _live()
    _train_a_little(policy, learner)
    torch.manual_seed(5), np.random.seed(6), random.seed(7)
    saved = _save(tmp_path, policy, engine, learner, step=3)
    draws = (torch.rand(3), np.random.rand(3), random.random(),
             torch.rand(3, generator=engine._gen))
    weights = {k: v.clone() for k, v in policy.model.state_dict().items()}
    moments = learner.optimizer.state_dict()["state"][0]["exp_avg"].clone()

    fresh, fresh_engine, fresh_learner = _live(seed=1)  # other weights, other generator
    progress = checkpoint.restore(checkpoint.latest(tmp_path), policy=fresh,
                                  learner=LocalLearner(fresh, fresh_learner),
                                  engine=fresh_engine)
    assert progress == {"history": [{"x": 1.0}]}
    assert all(torch.equal(weights[k], v) for k, v in fresh.model.state_dict().items())
    assert torch.equal(fresh_learner.optimizer.state_dict()["state"][0]["exp_avg"], moments)
    assert fresh_learner.updates == 2 and fresh.version == 2
    again = (torch.rand(3), np.random.rand(3), random.random(),
             torch.rand(3, generator=fresh_engine._gen))
    assert torch.equal(draws[0], again[0]) and np.array_equal(draws[1], again[1])
    assert draws[2] == again[2] and torch.equal(draws[3], again[3])
    assert saved.manifest.step == 3 and saved.manifest.policy_version == 2
    assert sorted(p.name for p in saved.path.iterdir()) == [
        "COMPLETE", "manifest.json", "model.safetensors", "progress.json", "state.pt"]


def test_a_write_killed_midway_is_ignored_and_replaced(tmp_path):
    policy, engine, learner = _live()
    _save(tmp_path, policy, engine, learner, step=1)
    partial = tmp_path / "step-3"  # a write killed before its marker: junk, no COMPLETE
    partial.mkdir()
    (partial / "model.safetensors").write_bytes(b"half a file")
    (tmp_path / ".tmp-step-5-123-abcdef").mkdir()
    assert checkpoint.latest(tmp_path).step == 1
    checkpoint.restore(checkpoint.latest(tmp_path), policy=policy,
                       learner=LocalLearner(policy, learner), engine=engine)
    _save(tmp_path, policy, engine, learner, step=3)
    assert checkpoint.latest(tmp_path).step == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-1", "step-3"]


def test_only_the_newest_keep_checkpoints_stay(tmp_path):
    policy, engine, learner = _live()
    for step in (1, 3, 5, 7):
        _save(tmp_path, policy, engine, learner, step=step, keep=2)
    assert [c.step for c in checkpoint.complete(tmp_path)] == [5, 7]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-5", "step-7"]


def test_a_checkpoint_marked_complete_with_a_bad_manifest_names_its_folder(tmp_path):
    policy, engine, learner = _live()
    saved = _save(tmp_path, policy, engine, learner, step=2)
    (saved.path / "manifest.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="step-2.*manifest.json"):
        checkpoint.latest(tmp_path)


def test_a_pipeline_without_a_learner_cannot_load_one(tmp_path):
    policy, engine, learner = _live()
    _save(tmp_path, policy, engine, learner, step=0)
    with pytest.raises(CheckpointError, match="has no train stage"):
        checkpoint.restore(checkpoint.latest(tmp_path), policy=policy,
                           learner=LocalLearner(policy, None), engine=engine)
