"""``gfcr run --executor local`` runs without Prefect: not one Prefect module is imported
(issue 33: a bare GPU machine has no Prefect, and the command imported it at load)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHECK = """
import sys
from typer.testing import CliRunner
from gfcr.cli import app
result = CliRunner().invoke(app, ["run", sys.argv[1], "--json", "--root", sys.argv[2],
                                  "--executor", "local", "--set", "group.n=2"])
assert result.exit_code == 0, result.output
loaded = sorted(m for m in sys.modules if m == "prefect" or m.startswith("prefect."))
assert not loaded, f"gfcr run --executor local imported {len(loaded)} Prefect modules"
print("ROLLOUTS", result.stdout.strip().splitlines()[-1])
"""


def test_gfcr_run_with_the_local_executor_imports_no_prefect(tmp_path):
    pipeline = tmp_path / "tiny.py"
    pipeline.write_text("from tests.conftest import tiny_pipeline\n"
                        "pipeline = tiny_pipeline(steps=1)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get(
        "PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", CHECK, str(pipeline), str(tmp_path / "root")],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert '"rollouts": 8' in done.stdout  # the run did run: batch 4 x n 2
