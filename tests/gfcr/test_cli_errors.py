"""A user's mistakes, as the gfcr command reports them: every problem of a pipeline file
at once, and a failure during a run as one paragraph with no traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gfcr.core.loading import load
from gfcr.core.pipeline import PipelineError
from gfcr.config.problems import counted

HEADER = """\
from gfcr import Evaluation, Pipeline
from stages import GRPO, HF, DynamicSampling, GroupSample, ReasoningGym, TinyLlama, UniformSampler, Verify
"""

THREE_MISTAKES = HEADER + """
pipeline = Pipeline(
    name="three-mistakes",
    task=ReasoningGym(dataset="chain_sum", train_size=8, heldout_size=64),
    policy=TinyLlama(hidden_size=32, num_layers=1, num_heads=2),
    engine=HF(),
    stages=[
        UniformSampler(batch=4, bacth=3),
        GroupSample(n=0, max_tokens=8),
        Verify(),
        GRPO(lr=1e-5),
        DynamicSampling(),
    ],
)
"""

LETTERS_CHAR = HEADER + """
pipeline = Pipeline(
    name="letters",
    steps=1,
    task=ReasoningGym(dataset="letter_counting", train_size=1200, heldout_size=8),
    policy=TinyLlama(hidden_size=32, num_layers=1, num_heads=2, tokenizer="char"),
    engine=HF(device="cpu"),
    stages=[UniformSampler(batch=2), GroupSample(n=2, max_tokens=4), Verify()],
    evaluation=Evaluation(size=4, max_tokens=4),
)
"""


def _gfcr(cwd: Path, *args: str, env: dict[str, str] | None = None
          ) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gfcr.cli", *args], capture_output=True,
                          text=True, cwd=cwd, env={**os.environ, **(env or {})}, timeout=600)


def test_three_mistakes_three_named_problems_no_traceback(tmp_path):
    path = tmp_path / "mine.py"
    path.write_text(THREE_MISTAKES)
    result = _gfcr(tmp_path, "run", "mine.py", "--root", str(tmp_path / "root"))  # relative
    assert result.returncode == 2, result.stderr
    err = result.stderr
    assert "Traceback" not in err and "(3 problems)" in err, err
    assert "mine.py:10: UniformSampler: field 'bacth': Extra inputs are not permitted" in err
    assert "mine.py:11: GroupSample: field 'n': Input should be greater than or equal to 1" in err
    assert "stage 'dynamic_sampling' (filter) comes after 'grpo' (train)" in err
    assert not (tmp_path / "root").exists()  # nothing ran, nothing was written


def test_python_error_in_the_file_comes_with_the_earlier_problems(tmp_path):
    path = tmp_path / "typo.py"
    path.write_text(HEADER + "sampler = UniformSampler(batch=-1)\nsample = GroupSampel(n=2)\n")
    with pytest.raises(PipelineError) as info:
        load(str(path))
    assert info.value.problems == [
        "typo.py:3: UniformSampler: field 'batch': Input should be greater than or equal to "
        "1 (got -1)",
        "typo.py:4: NameError: name 'GroupSampel' is not defined"]


def test_outside_a_file_an_invalid_stage_raises_at_once():
    from pydantic import ValidationError

    from stages import GroupSample
    with pytest.raises(ValidationError, match="greater than or equal to 1"):
        GroupSample(n=0)


def test_a_failing_run_prints_one_paragraph(tmp_path, prefect_server):
    """letter_counting holds an 'à' that the ASCII tokenizer cannot encode: refused at the
    start of the run, under Prefect, in one paragraph (not Prefect's tracebacks)."""
    from prefect.settings import PREFECT_API_URL

    path = tmp_path / "letters.py"
    path.write_text(LETTERS_CHAR)
    result = _gfcr(tmp_path, "run", str(path), "--root", str(tmp_path / "root"), "--no-track",
                   env={"PREFECT_API_URL": str(PREFECT_API_URL.value())})
    assert result.returncode == 1, result.stderr
    err = result.stderr
    assert "Traceback" not in err, err
    paragraph = err[err.index("error: TokenizerError"):].strip().splitlines()
    assert len(paragraph) == 2 and "--debug" in paragraph[1], err
    assert "task 'letter_counting'" in paragraph[0] and "'à' (U+00E0)" in paragraph[0]
    assert "set policy.tokenizer='byte'" in paragraph[0]
    debug = _gfcr(tmp_path, "--debug", "run", str(path), "--root", str(tmp_path / "root"),
                  "--no-track", "--executor", "local")
    assert "Traceback" in debug.stderr and "TokenizerError" in debug.stderr


def test_repeated_errors_are_counted_once():
    assert counted(["ValueError: x", None, "ValueError: x", "KeyError: y", "ValueError: x"]
                   ) == ["ValueError: x (3x)", "KeyError: y"]
