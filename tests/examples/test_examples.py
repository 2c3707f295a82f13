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
