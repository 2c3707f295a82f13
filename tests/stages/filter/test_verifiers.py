"""Verifiers behind one protocol; Verify records every failure and never stops."""

from __future__ import annotations

import json
import time

import pytest
from pydantic import ValidationError

from gfcr.core.rollout import col
from tests.conftest import SUMS
from stages import CodeTests, Function, Match, MathAnswer, ReasoningGym, Sandbox, TaskScore, Verify
from stages.filter.verifiers import Wrong, code_and_tests
from stages.filter.verify import SCORE_ISOLATION, ScorerFailed
from tests.resources.rollouts import context, rollouts

FAST = Sandbox(cpu_seconds=1, wall_seconds=3.0, memory_mb=256)


def _scores(verifier, completion, answer="42", meta=None, task=None):
    return verifier.scorer(context(task=task))(completion, answer, meta)


def test_task_scorer_is_the_reasoning_gym_scorer():
    task = ReasoningGym(train_size=4, heldout_size=1, config=SUMS)
    row = task.train_prompts().to_pylist()[0]
    assert _scores(TaskScore(), f" {row['answer']} ", row["answer"], row["meta"], task) == 1.0
    assert _scores(TaskScore(), "no idea", row["answer"], row["meta"], task) == 0.0


def test_math_answers_are_compared_as_math():
    assert _scores(MathAnswer(), "so the result is $\\frac{1}{2}$", "0.5") == 1.0
    assert _scores(MathAnswer(), "x = 2/4", "1/2") == 1.0
    assert _scores(MathAnswer(), "so the result is 1/3", "0.5") == 0.0


def test_exact_and_regex_match():
    assert _scores(Match(), "  42\n") == 1.0
    assert _scores(Match(), "42.") == 0.0
    regex = Match(pattern=r"answer:\s*(-?\d+)")
    assert _scores(regex, "blah answer: 42 done") == 1.0
    assert _scores(regex, "blah answer: 41") == 0.0
    assert _scores(regex, "no answer here") == 0.0
    assert _scores(Match(case_sensitive=False), "YES", "yes") == 1.0
    with pytest.raises(ValidationError, match="not a regular expression"):
        Match(pattern="(")


def test_code_is_run_against_the_tests_in_the_sandbox():
    meta = json.dumps({"tests": ["assert square(3) == 9", "assert square(-2) == 4"]})
    good = "Here you go:\n```python\ndef square(x):\n    return x * x\n```"
    assert _scores(CodeTests(sandbox=FAST), good, None, meta) == 1.0
    assert _scores(CodeTests(sandbox=FAST), "def square(x):\n    return x + x", None, meta) == 0.0
    with pytest.raises(Wrong, match="crashed.*SyntaxError"):  # reward 0, with the reason
        _scores(CodeTests(sandbox=FAST), "def square(x) return", None, meta)
    assert code_and_tests(good, None, meta) == ("def square(x):\n    return x * x\n",
                                                "assert square(3) == 9\nassert square(-2) == 4")
    assert code_and_tests("print(1)", "assert f() == 1", None) == ("print(1)", "assert f() == 1")


def test_shorthands_name_verifiers_and_bad_ones_are_rejected():
    assert isinstance(Verify(scorer="math").verifier(), MathAnswer)
    assert Verify(scorer="regex:(\\d+)").verifier() == Match(pattern="(\\d+)")
    assert Verify(scorer="tests.resources.digits:explode").verifier() == \
        Function(ref="tests.resources.digits:explode")
    with pytest.raises(ValidationError, match="'regex:<pattern>' or 'module:function'"):
        Verify(scorer="nonsense")
    with pytest.raises(ValidationError,
                       match="must exceed the code verifier's sandbox.wall_seconds"):
        Verify(scorer=CodeTests(sandbox=FAST), timeout=2.0)


def test_verify_records_errors_timeouts_and_hostile_code_and_goes_on():
    tests = json.dumps({"tests": ["assert f() == 1"]})
    table = rollouts(["g"] * 4, completion=[
        "def f():\n    return 1",            # correct
        "def f():\n    while True: pass",    # spins: the sandbox stops it
        "import os\nwhile True: os.fork()",  # fork bomb
        "def f():\n    return 2"],           # wrong
        meta=[tests] * 4, answer=[None] * 4)
    stage = Verify(scorer=CodeTests(sandbox=FAST.model_copy(update={"wall_seconds": 8.0})),
                   timeout=20.0, on_error="zero")
    result = stage.apply(context(), table)
    out = result.table
    assert out.column(col.REWARD).to_pylist() == [1.0, 0.0, 0.0, 0.0]
    errors = out.column(col.SCORE_ERROR).to_pylist()
    assert errors[0] is None and errors[3] is None
    assert "SandboxViolation" in errors[1] and "cpu_time" in errors[1]
    assert "SandboxViolation" in errors[2] and "processes" in errors[2]
    assert result.keep == [True] * 4  # on_error="zero": scored 0, kept
    assert out.column(col.REWARDS).to_pylist()[0] == [("verify", 1.0)]
    assert out.column(SCORE_ISOLATION).to_pylist() == ["namespaces"] * 4


def test_a_nan_scorer_is_a_failure_and_ends_the_run():
    table = rollouts(["g", "g"])
    with pytest.raises(ScorerFailed, match=r"failed on all 2 rollouts \(first error: scorer "
                                           r"returned nan\).*--resume run"):
        Verify(scorer="tests.resources.scorers:nan").apply(context(), table)


def test_a_verifier_config_round_trips_through_a_pipeline(pipeline):
    from gfcr import Pipeline

    stages = list(pipeline.stages)
    stages[2] = Verify(scorer=CodeTests(sandbox=FAST), timeout=5.0)
    p = Pipeline(**{**pipeline.to_dict(), "stages": [s.model_dump() for s in stages]})
    assert p.stage("verify").scorer == CodeTests(sandbox=FAST)
    assert Pipeline.from_yaml(p.to_yaml()).spec_hash() == p.spec_hash()
