"""`gfcr run` exits non-zero whenever its run did not finish (issue 26 item 8): a scorer
calling os._exit(0) ended it with status 0 (sys.exit is a scorer failure already). The
scorer runs in the run's own process here (worker=False): in a scorer worker, the
default for a module:function scorer, it only ends the worker
(tests/stages/filter/test_scorer_workers.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from gfcr.commands.exits import UNFINISHED

REPO = Path(__file__).resolve().parents[2]
PIPELINE_FILE = """
from stages import GRPO, GroupSample, UniformSampler, Verify
from tests.conftest import tiny_pipeline
pipeline = tiny_pipeline(steps=1, stages=[UniformSampler(batch=2), GroupSample(n=2, max_tokens=4),
                         Verify(scorer="tests.resources.exits:os_exit", worker=False), GRPO()])
"""


def test_a_run_ended_by_its_own_code_exits_non_zero(tmp_path):
    path = tmp_path / "p.py"
    path.write_text(PIPELINE_FILE)
    quiet = subprocess.run([sys.executable, "-m", "gfcr.cli", "run",
                            str(path), "--root", str(tmp_path / "a"),
                            "--executor", "local", "--no-track"], cwd=REPO,
                           capture_output=True, text=True, timeout=600)
    assert quiet.returncode == UNFINISHED, quiet.stderr[-3000:]
    assert "did not finish" in quiet.stderr and "os._exit(0)" in quiet.stderr
