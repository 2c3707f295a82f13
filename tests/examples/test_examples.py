"""Every script in examples/ runs as a user would run it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_quickstart_runs_and_queries_the_store(tmp_path):
    result = subprocess.run([sys.executable, str(EXAMPLES / "quickstart.py"),
                             str(tmp_path / "root")], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr
    assert "32 rollouts stored" in result.stdout
    assert "'dropped_by'" in result.stdout


def test_the_environment_example_trains_and_is_the_readme_s(tmp_path):
    """examples/environment.py (README, "Multi-turn environments") runs two steps and
    stores its episodes; the README shows the same code."""
    from gfcr.core.loading import load
    from gfcr.launch.run import execute
    from store import RolloutStore

    source = (EXAMPLES / "environment.py").read_text()
    body = source.split('"""\n\n', 1)[1]  # the code after the module docstring
    readme = (EXAMPLES.parent / "README.md").read_text()
    assert body.strip() in readme
    summary = execute(load(str(EXAMPLES / "environment.py")), root=tmp_path, executor="local")
    assert summary.steps == 2
    with RolloutStore.open(tmp_path / "store", read_only=True) as s:
        ends = s.sql("SELECT DISTINCT episode_end FROM rollouts").column(0).to_pylist()
        sources = s.sql("SELECT DISTINCT source FROM turns").column(0).to_pylist()
    assert set(ends) <= {"done", "turn_limit"} and "turn_limit" in ends
    assert {"environment", "policy"} <= set(sources)
