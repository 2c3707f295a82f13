"""The Pipeline: validation rules (one broken pipeline each), YAML, hash, overrides, load."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from typing import ClassVar, Literal

import pytest

from gfcr import Pipeline, PipelineError, StageSpec, register
from gfcr.core.loading import load
from stages import DynamicSampling, GroupSample, UniformSampler, Verify
from tests.conftest import tiny_pipeline


def _problems(**overrides) -> list[str]:
    with pytest.raises(PipelineError) as info:
        tiny_pipeline(**overrides)
    return info.value.problems


def _stage_dicts(pipeline: Pipeline) -> list[dict]:
    return pipeline.to_dict()["stages"]


def test_unknown_stage_type_names_position_and_type(pipeline):
    stages = _stage_dicts(pipeline) + [{"type": "no_such_filter"}]
    (problem,) = _problems(stages=stages)
    assert "stages[5]" in problem and "'no_such_filter'" in problem and "known:" in problem


def test_unknown_field_names_stage_and_field(pipeline):
    stages = _stage_dicts(pipeline)
    stages[1]["temprature"] = 0.5
    (problem,) = _problems(stages=stages)
    assert "'group'" in problem and "'temprature'" in problem


def test_wrong_type_names_stage_field_and_value(pipeline):
    stages = _stage_dicts(pipeline)
    stages[1]["n"] = "eight"
    (problem,) = _problems(stages=stages)
    assert "'group'" in problem and "'n'" in problem and "'eight'" in problem


def test_kinds_out_of_order(pipeline):
    s = list(pipeline.stages)
    problems = _problems(stages=[s[0], s[2], s[1], s[3], s[4]])
    assert any("'group' (generate) comes after 'verify' (filter)" in p for p in problems)


def test_column_read_but_never_written(pipeline):
    s = list(pipeline.stages)
    problems = _problems(stages=[s[0], s[1], s[3], s[4]])  # no Verify
    assert problems == [
        "stage 'dynamic_sampling' reads column 'reward', which no upstream stage writes",
        "stage 'grpo' reads column 'reward', which no upstream stage writes"]


def test_exactly_one_generate_stage(pipeline):
    s = list(pipeline.stages)
    problems = _problems(stages=[s[0], s[2], s[3]])
    assert any("exactly one generate stage" in p for p in problems)
    problems = _problems(stages=[s[0], s[1], GroupSample(name="again"), s[2]])
    assert any("found 2 (group, again)" in p for p in problems)


def test_duplicate_stage_names(pipeline):
    s = list(pipeline.stages)
    (problem,) = _problems(stages=[s[0], s[1], s[2], Verify(), s[3]])
    assert "'verify' is used twice" in problem


def test_stage_name_clashing_with_pipeline_field(pipeline):
    s = list(pipeline.stages)
    (problem,) = _problems(stages=[s[0], s[1], Verify(name="task")])
    assert "'task' clashes" in problem


@register("control")
class _StopOwnerA(StageSpec):
    type: Literal["_test_stop_a"] = "_test_stop_a"
    owns: ClassVar[frozenset[str]] = frozenset({"stop"})

    def on_segment(self, ctx, inflight):
        return {}


@register("control")
class _StopOwnerB(StageSpec):
    type: Literal["_test_stop_b"] = "_test_stop_b"
    owns: ClassVar[frozenset[str]] = frozenset({"stop"})

    def on_segment(self, ctx, inflight):
        return {}


def test_two_owners_of_one_decision(pipeline):
    s = list(pipeline.stages)
    (problem,) = _problems(stages=[s[0], _StopOwnerA(), _StopOwnerB(), *s[1:]])
    assert "'_test_stop_a' and '_test_stop_b' both own the 'stop' decision" in problem


def test_every_problem_reported_at_once(pipeline):
    stages = _stage_dicts(pipeline)
    stages[0]["batch"] = 0
    stages[1]["bogus"] = 1
    del stages[2]  # Verify: DynamicSampling then reads an unwritten column...
    problems = _problems(stages=stages, steps=0)
    # ...but field errors stop the structural pass, so three field problems come first
    assert len(problems) == 3
    assert any("'uniform'" in p and "'batch'" in p for p in problems)
    assert any("'bogus'" in p for p in problems)
    assert any("'steps'" in p for p in problems)


def test_register_rejects_duplicates_and_missing_methods():
    with pytest.raises(ValueError, match="already registered"):
        @register("filter")
        class Verify2(StageSpec):  # noqa: F811 - deliberately reuses the name 'verify'
            type: Literal["verify"] = "verify"

            def apply(self, ctx, rollouts):
                return None
    with pytest.raises(TypeError, match="lacks"):
        @register("filter")
        class NoApply(StageSpec):
            type: Literal["_no_apply"] = "_no_apply"


def test_yaml_round_trip_and_stable_hash(pipeline):
    again = Pipeline.from_yaml(pipeline.to_yaml())
    assert again == pipeline and again.spec_hash() == pipeline.spec_hash()
    code = ("from tests.conftest import tiny_pipeline; print(tiny_pipeline().spec_hash())")
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True).stdout.strip()
    assert other == pipeline.spec_hash()
    assert tiny_pipeline(seed=1).spec_hash() != pipeline.spec_hash()


def test_overrides(pipeline):
    changed = pipeline.with_overrides(["grpo.lr=0.01", "steps=3", "group.n=2",
                                       "task.train_size=32"])
    assert changed.stage("grpo").lr == 0.01 and changed.steps == 3
    assert changed.stage("group").n == 2 and changed.task.train_size == 32
    assert pipeline.stage("grpo").lr == 1e-3  # the original is untouched
    with pytest.raises(PipelineError, match="no component or stage named 'grop'"):
        pipeline.with_overrides(["grop.lr=1"])
    with pytest.raises(PipelineError, match="'group'.*'temp'"):
        pipeline.with_overrides(["group.temp=1"])
    with pytest.raises(PipelineError, match="expected PATH=VALUE"):
        pipeline.with_overrides(["grpo.lr"])


def test_load_files_and_names(tmp_path, pipeline):
    yaml_file = tmp_path / "p.yaml"
    yaml_file.write_text(pipeline.to_yaml())
    assert load(str(yaml_file)) == pipeline
    empty = tmp_path / "empty.py"
    empty.write_text("x = 1\n")
    with pytest.raises(PipelineError, match=r"must define `pipeline = Pipeline\(...\)`"):
        load(str(empty))
    with pytest.raises(PipelineError, match="neither a .py/.yaml file nor a known pipeline"):
        load("nope")
    assert load("default").name == "default"


def test_python_dsl_file(tmp_path):
    source = tmp_path / "mine.py"
    source.write_text(textwrap.dedent("""
        from tests.conftest import tiny_pipeline
        def pipeline():
            return tiny_pipeline(name="mine")
    """))
    assert load(str(source)).name == "mine"


def test_stage_classes_are_strict():
    with pytest.raises(Exception, match="frozen"):
        UniformSampler().batch = 3  # type: ignore[misc]
    assert DynamicSampling().reads == {"reward", "group_id"}
