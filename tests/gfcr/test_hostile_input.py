"""Issue 26, items 5 and 6: bad input stops before any work, naming file, line and field;
numbers are finite and bounded; rewards out of range are clipped with a warning. One test
per attack class of the drill (each failed on main before this change)."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch

from gfcr.core.loading import load
from gfcr.core.pipeline import Pipeline, PipelineError
from tests.conftest import tiny_pipeline


@pytest.fixture(scope="module")
def spec_yaml() -> str:
    return tiny_pipeline(steps=1).to_yaml()


def _refused(tmp_path, text: str) -> str:
    path = tmp_path / "p.yaml"
    path.write_text(text)
    with pytest.raises(PipelineError) as info:
        load(str(path))
    return str(info.value)


def _line(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


def test_yaml_alias_bomb_is_refused_before_it_expands(tmp_path, spec_yaml):
    """A few hundred bytes of nested aliases that expand to 9**9 values (main: a minute
    and gigabytes before any error)."""
    bomb = ["bomb:", "  a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    bomb += [f"  a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)]
    text = spec_yaml + "\n".join(bomb) + "\n"
    message = _refused(tmp_path, text)
    line = int(re.search(r"p\.yaml:(\d+):\d+: the aliases expand to more than 100000 "
                         "values", message).group(1))
    assert _line(text, "a1:") < line <= _line(text, "a8:")  # the first alias too large


def test_yaml_aliases_that_stay_small_are_read(tmp_path, spec_yaml):
    text = spec_yaml.replace("lr: 0.001", "lr: &lr 0.002") + "steps_alias: *lr\n"
    message = _refused(tmp_path, text)  # the alias itself is fine; the extra key is not
    assert "steps_alias" in message and "Extra inputs are not permitted" in message


def test_yaml_duplicate_key_is_refused_naming_key_and_lines(tmp_path, spec_yaml):
    """PyYAML keeps the last of two equal keys silently (main ran ``steps: 3``)."""
    text = spec_yaml.replace("steps: 1\n", "steps: 1\nsteps: 3\n")
    message = _refused(tmp_path, text)
    first, second = _line(text, "steps: 1"), _line(text, "steps: 3")
    assert f"p.yaml:{second}:1: key 'steps' is given twice (first on line {first})" in message


def test_yaml_tab_error_names_the_file_and_line(tmp_path, spec_yaml):
    """main: ``in "<unicode string>", line 12``."""
    text = spec_yaml.replace("  train_size: 64", "\ttrain_size: 64")
    message = _refused(tmp_path, text)
    assert f"{tmp_path / 'p.yaml'}:{_line(text, 'train_size')}:1:" in message
    assert "tab" in message and "<unicode string>" not in message


@pytest.mark.parametrize("nesting", ["[" * 5000 + "]" * 5000, "[" * 70 + "]" * 70])
def test_yaml_deep_nesting_is_refused(tmp_path, spec_yaml, nesting):
    """main: RecursionError from the YAML parser."""
    text = spec_yaml.replace("warmstart: null", f"warmstart: {nesting}")
    message = _refused(tmp_path, text)
    assert f"p.yaml:{_line(text, 'warmstart')}:" in message
    assert "nest" in message and "RecursionError" not in message


def test_yaml_huge_integer_is_refused_naming_field_and_line(tmp_path, spec_yaml):
    """main: accepted, and the run went on until an int overflowed (or forever)."""
    text = spec_yaml.replace("train_size: 64", "train_size: " + "9" * 40)
    message = _refused(tmp_path, text)
    assert f"field 'train_size' at {tmp_path / 'p.yaml'}:{_line(text, 'train_size')}" in message
    assert "less than or equal to 1000000" in message
    text = spec_yaml.replace("steps: 1", "steps: " + "9" * 40)  # no bound of its own
    assert (f"field 'steps' at {tmp_path / 'p.yaml'}:3: Value error, must be at most "
            "2147483647") in _refused(tmp_path, text)
    text = spec_yaml.replace("steps: 1", "steps: " + "9" * 5000)  # more than Python converts
    assert f"p.yaml:{_line(text, 'steps')}:8: an integer of 5000 characters" in _refused(
        tmp_path, text)


@pytest.mark.parametrize("field, value", [("steps", 10**40), ("seed", -(10**40))])
def test_huge_integers_are_refused_in_python_pipelines(field, value):
    with pytest.raises(PipelineError, match=f"field '{field}'"):
        tiny_pipeline(**{field: value})


def test_impossible_heldout_size_is_refused_at_build():
    """main: evaluated on the 16 prompts there were, silently."""
    from gfcr import Evaluation
    with pytest.raises(PipelineError) as info:
        tiny_pipeline(evaluation=Evaluation(size=80))
    assert ("evaluation: field 'size' is 80 but the task has 16 held-out prompts "
            "(task.heldout_size)") in str(info.value)


def test_impossible_batch_size_is_refused_at_build():
    from stages import GRPO, DynamicSampling, GroupSample, UniformSampler, Verify
    with pytest.raises(PipelineError) as info:
        tiny_pipeline(stages=[UniformSampler(batch=65), GroupSample(n=4, max_tokens=6),
                              Verify(), DynamicSampling(), GRPO(lr=1e-3)])
    assert ("stage 'uniform': field 'batch' is 65 but the task has 64 training prompts"
            in str(info.value))


@pytest.mark.parametrize("assignment, needle", [
    ("grpo.lr=.inf", "field 'lr'"), ("grpo.lr=.nan", "field 'lr'"),
    ("grpo.lr=10", "field 'lr'"), ("grpo.clip_high=1e300", "field 'clip_high'"),
    ("verify.timeout=1e300", "field 'timeout'"), ("group.temperature=-.inf", "field 'temperature'"),
    ("task.config.max_digits=.nan", "field 'config'"),
])
def test_non_finite_or_absurd_hyperparameters_are_refused_naming_the_field(assignment, needle):
    """main: ``lr=inf`` was accepted and turned the weights into NaN."""
    with pytest.raises(PipelineError) as info:
        tiny_pipeline().with_overrides([assignment])
    assert needle in str(info.value)


def test_reward_of_1e308_is_clipped_with_a_warning_and_the_weights_stay_finite():
    """main: the advantages became NaN, then the weights, then a torch error."""
    from gfcr.runner.inprocess import local_services
    from gfcr.runner.loop import Runtime, run_step
    from gfcr.transport.stash import MemoryStash
    from stages import GRPO, GroupSample, UniformSampler, Verify

    p = tiny_pipeline(steps=2, stages=[
        UniformSampler(batch=4), GroupSample(n=4, max_tokens=6),
        Verify(scorer="tests.resources.hostile_rewards:astronomical"), GRPO(lr=1e-3)])
    policy = p.policy.build(seed=0)
    services = local_services(p.engine.build(policy, seed=0), policy,
                              p.stages[-1].learner(policy, seed=0))
    rt = Runtime(pipeline=p, task=p.task, services=services, stash=MemoryStash())
    for step in range(2):
        with pytest.warns(RuntimeWarning, match=rf"step {step}: \d+ reward\(s\) outside the "
                          r"pipeline's reward_range \[-1e\+06, 1e\+06\]"):
            report = run_step(rt, "r", step, lambda name, fn, *args: fn(*args))
        assert report.metrics["reward_out_of_range"] > 0
        rewards = rt.stash.get(report.rollouts).column("reward").to_pylist()
        assert max(rewards) == 1e6 and all(math.isfinite(r) for r in rewards)
        assert math.isfinite(report.metrics["train/loss"])
    assert all(torch.isfinite(w).all() for w in policy.model.parameters())


def test_rewards_out_of_range_may_drop_their_rollouts_instead():
    from gfcr.core.rollout import col
    from gfcr.core.settings import RewardRange
    from gfcr.runner.rewards import bounded
    from tests.resources.rollouts import rollouts

    table = rollouts(["a", "a", "b", "b"], reward=[0.0, 1.0, 1e308, -1e200])
    with pytest.warns(RuntimeWarning, match="were clipped to it and dropped from training"):
        out, count = bounded(table, RewardRange(out_of_range="drop"), 3)
    assert count == 2
    assert out.column(col.REWARD).to_pylist() == [0.0, 1.0, 1e6, -1e6]
    assert out.column(col.KEPT).to_pylist() == [True, True, False, False]
    assert out.column(col.DROPPED_BY).to_pylist()[2:] == ["reward_range"] * 2


def test_reward_range_is_set_and_round_trips_but_old_specs_keep_their_hash():
    p = tiny_pipeline()
    assert "reward_range" not in p.to_dict()
    q = p.with_overrides(["reward_range.high=10"])
    assert q.reward_range.high == 10 and q.reward_range.low == -1e6
    assert Pipeline.from_yaml(q.to_yaml()).spec_hash() == q.spec_hash() != p.spec_hash()
    with pytest.raises(PipelineError, match="must not be above"):
        p.with_overrides(["reward_range.low=5", "reward_range.high=1"])


@pytest.mark.parametrize("name", ["grpo", "drgrpo", "rloo", "reinforce", "gdpo", "mc_grpo"])
def test_rewards_of_1e200_give_finite_nonzero_advantages(name):
    """main: the squared deviations overflowed to inf and every advantage was 0."""
    from stages.advantages import lookup_advantage
    rewards = np.array([1e200, -1e200, 1e200, -1e200, 3e200, -2e200])
    adv = lookup_advantage(name)(rewards, np.array([0, 0, 1, 1, 2, 2]))
    assert np.all(np.isfinite(adv))
    assert np.count_nonzero(adv) >= (3 if name == "mc_grpo" else 6)  # MC-GRPO: pivots are 0
    assert np.all(np.sign(adv[adv != 0]) == np.sign(rewards[adv != 0]))
    small = lookup_advantage(name)(rewards / 1e200, np.array([0, 0, 1, 1, 2, 2]))
    if name in ("grpo", "reinforce", "gdpo"):  # scale-free estimators: the same advantages
        np.testing.assert_allclose(adv, small, rtol=1e-6)
