"""bench/gpu/nccl_broadcast.py in its CPU mode (gloo, two real processes): the GPU
script cannot fail on the lent machine for a reason this machine could have shown."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_broadcast_script_measures_an_intact_broadcast_between_two_ranks(tmp_path):
    out = tmp_path / "nccl_broadcast.json"
    done = subprocess.run([sys.executable, str(REPO / "bench/gpu/nccl_broadcast.py"), "--cpu",
                           "--models", "tiny", "--repeats", "1", "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["backend"] == "gloo" and report["nccl_error"] is None
    (row,) = report["models"]
    assert row["model"] == "tiny" and row["received_intact"]
    assert row["bytes"] == row["params"] * 4 and row["seconds_per_version"] > 0
