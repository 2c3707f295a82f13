"""The supervised warm start: it learns, it is deterministic, and its cache is reused."""

import time

import pytest
import torch
from pydantic import ValidationError

from tests.conftest import SUMS
from stages.engines.tiny import TinyLlama
from stages.tasks.reasoning_gym import ReasoningGym
from stages.train.sft import SFT, _examples

TINY = TinyLlama(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
TASK = ReasoningGym(train_size=32, heldout_size=8, config=SUMS)
SPEC = SFT(steps=20, batch_size=8, lr=1e-2)


def _weights(policy):
    return {k: v.clone() for k, v in policy.model.state_dict().items()}


def test_examples_are_prompt_then_answer_and_eos():
    policy = TINY.build(seed=0)
    first = _examples(policy, TASK, None)[0]
    row = TASK.train_prompts().to_pylist()[0]
    tok = policy.tokenizer
    assert first.prompt == tok.encode(row["prompt"])  # as the engine encodes prompts
    assert first.completion == tok.encode(row["answer"]) + [tok.eos_token_id]
    assert all(first.mask)  # every answer token is in the loss


def test_training_learns_writes_the_cache_and_a_second_run_loads_it(tmp_path):
    untrained = SFT(steps=1, batch_size=8, lr=1e-2).run(TINY.build(seed=0), TASK, seed=0,
                                                         cache_dir=tmp_path / "one")
    trained = TINY.build(seed=0)
    started = time.perf_counter()
    out = SPEC.run(trained, TASK, seed=0, cache_dir=tmp_path)
    train_seconds = time.perf_counter() - started
    assert out["cached"] == 0.0 and out["loss"] < untrained["loss"]
    assert len(list(tmp_path.glob("sft-*.safetensors"))) == 1

    fresh = TINY.build(seed=0)
    started = time.perf_counter()
    again = SPEC.run(fresh, TASK, seed=0, cache_dir=tmp_path)
    assert again["cached"] == 1.0
    assert time.perf_counter() - started < train_seconds / 2
    a, b = _weights(trained), _weights(fresh)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_deterministic_under_the_seed_and_keyed_by_it(tmp_path):
    one, two = TINY.build(seed=0), TINY.build(seed=0)
    SPEC.run(one, TASK, seed=0, cache_dir=tmp_path / "a")
    SPEC.run(two, TASK, seed=0, cache_dir=tmp_path / "b")
    a, b = _weights(one), _weights(two)
    assert all(torch.equal(a[k], b[k]) for k in a)
    policy = TINY.build(seed=0)
    keys = {SPEC.cache_key(policy, TASK, 0), SPEC.cache_key(policy, TASK, 1),
            SFT(steps=21, batch_size=8, lr=1e-2).cache_key(policy, TASK, 0),
            SPEC.cache_key(policy, TASK.model_copy(update={"seed": 5}), 0),
            SPEC.cache_key(TinyLlama(hidden_size=64).build(seed=0), TASK, 0)}
    assert len(keys) == 5


def test_config_is_strict():
    with pytest.raises(ValidationError, match="steps"):
        SFT(steps=0)
    with pytest.raises(ValidationError, match="extra"):
        SFT(epochs=3)


def test_learning_rate_schedules():
    constant = SFT(steps=20, warmup=0.1, schedule="constant")
    assert [constant._lr_factor(s) for s in (0, 1, 2, 19)] == [0.5, 1.0, 1.0, 1.0]
    cosine = SFT(steps=20, warmup=0.1, schedule="cosine")
    assert cosine._lr_factor(2) == pytest.approx(1.0)
    assert cosine._lr_factor(11) == pytest.approx(0.55)  # half way: 0.1 + 0.9 / 2
    assert cosine._lr_factor(20) == pytest.approx(0.1)
