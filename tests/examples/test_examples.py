"""Every script in examples/ runs as a user would run it."""

from __future__ import annotations

import json
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


def test_your_own_data_is_the_readme_s_three_lines(tmp_path, monkeypatch):
    """README "Your own data": the data script writes the shipped file; the run (shrunk
    here: one step, a 2-step warm start, a smaller policy) trains on it and exports a
    folder transformers loads; the SQL line reads its evaluations."""
    from transformers import AutoModelForCausalLM
    from typer.testing import CliRunner

    from gfcr.cli import app

    readme = (EXAMPLES.parent / "README.md").read_text()
    block = readme.split("## Your own data", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    lines = block.strip().splitlines()
    assert lines[:2] == ["python examples/sums_data.py",
                         "gfcr run examples/own_data.yaml --export sums-model"]
    assert lines[2].startswith("gfcr sql ") and len(lines) == 3
    written = tmp_path / "sums.jsonl"
    made = subprocess.run([sys.executable, str(EXAMPLES / "sums_data.py"), str(written)],
                          capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    assert written.read_text() == (EXAMPLES / "data" / "sums.jsonl").read_text()
    monkeypatch.chdir(EXAMPLES.parent)  # the YAML's data path is relative to the repository
    shrink = ["steps=1", "warmstart.steps=2", "warmstart.batch_size=8", "evaluation.size=8",
              "evaluation.sampled.samples=2", "uniform.batch=4",
              "group.n=4", "policy.hidden_size=32", "policy.num_layers=1",
              "policy.num_heads=2", "policy.intermediate_size=64"]
    cli, root = CliRunner(), tmp_path / "root"
    done = cli.invoke(app, ["run", "examples/own_data.yaml", "--export", str(tmp_path / "m"),
                            "--executor", "local", "--no-track", "--root", str(root),
                            *[a for s in shrink for a in ("--set", s)]])
    assert done.exit_code == 0, done.output
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "m").config.hidden_size == 32
    query = lines[2][len("gfcr sql "):].strip('"')
    shown = cli.invoke(app, ["sql", query, "--root", str(root), "--format", "json"])
    assert shown.exit_code == 0, shown.output
    rows = json.loads(shown.stdout)
    assert [r["label"] for r in rows] == ["initial", "step=0", "step=1"]  # initial: before the warm start
    assert all(r["eval_set"] == "heldout" and r["mean_reward"] is not None and
               [k for k, _ in r["pass_at"]] == [1, 2] for r in rows), rows
