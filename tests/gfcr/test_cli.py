"""The gfcr command: run (JSON summary, overrides, bad input), sql (read-only, formats), runs."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from gfcr.cli import app
from gfcr.launch.run import execute
from tests.conftest import tiny_pipeline

runner = CliRunner()
PIPELINE_FILE = """
from tests.conftest import tiny_pipeline
pipeline = tiny_pipeline(steps=1)
"""


@pytest.fixture
def pipeline_file(tmp_path):
    path = tmp_path / "tiny.py"
    path.write_text(PIPELINE_FILE)
    return path


def _gfcr(*args):
    return subprocess.run([sys.executable, "-m", "gfcr.cli", *args], capture_output=True,
                          text=True)


def test_run_json_summary_and_sql(tmp_path, pipeline_file):
    root = tmp_path / "root"
    result = runner.invoke(app, ["run", str(pipeline_file), "--json", "--root", str(root),
                                 "--executor", "local", "--set", "group.n=2"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert {"run_id", "store", "accuracy_before", "accuracy_after", "rollouts",
            "seconds"} <= set(summary)
    assert summary["rollouts"] == 4 * 2  # batch 4, n overridden to 2
    assert summary["mlflow"].startswith("sqlite:///")

    out = runner.invoke(app, ["sql", "SELECT status, kept, count(*) AS n FROM rollouts "
                              "GROUP BY ALL ORDER BY ALL", "--root", str(root),
                              "--format", "json"])
    assert out.exit_code == 0, out.output
    rows = json.loads(out.stdout)
    assert sum(r["n"] for r in rows) == 8 and {r["status"] for r in rows} == {"complete"}

    csv = runner.invoke(app, ["runs", "--root", str(root), "--format", "csv"])
    assert csv.stdout.splitlines()[0].startswith("run_id,pipeline,status")
    assert summary["run_id"] in csv.stdout and "finished" in csv.stdout


def test_sql_refuses_writes_and_leaves_the_store_alone(tmp_path, pipeline_file):
    root = tmp_path / "root"
    runner.invoke(app, ["run", str(pipeline_file), "--root", str(root), "--executor",
                        "local", "--no-track"])
    refused = _gfcr("sql", "DELETE FROM rollouts", "--root", str(root))
    assert refused.returncode == 2
    assert "read-only" in refused.stderr and "DELETE" in refused.stderr
    left = _gfcr("sql", "SELECT count(*) AS n FROM rollouts", "--root", str(root),
                 "--format", "json")
    assert json.loads(left.stdout) == [{"n": 16}]


def test_sql_on_a_folder_that_is_not_a_store(tmp_path):
    result = _gfcr("sql", "SELECT 1", "--root", str(tmp_path / "nothing"))
    assert result.returncode == 2 and "nothing" in result.stderr


def test_bad_pipeline_file_is_one_clear_error(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(tiny_pipeline().to_yaml().replace("type: group", "type: grop"))
    result = _gfcr("run", str(bad), "--root", str(tmp_path / "r"))
    assert result.returncode == 2
    assert "unknown stage type 'grop'" in result.stderr and "stages[1]" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "r").exists()  # nothing was started


def test_bad_override_names_the_path(tmp_path, pipeline_file):
    result = runner.invoke(app, ["run", str(pipeline_file), "--set", "grpo.lr=fast",
                                 "--root", str(tmp_path)])
    assert result.exit_code == 2
    assert "'grpo'" in result.output and "'lr'" in result.output and "'fast'" in result.output


def test_sql_sees_committed_steps_while_a_run_is_going(tmp_path):
    """A reader process queries the store between two steps of a live run."""
    root = tmp_path / "root"
    seen: list[int] = []

    class Peek:
        def on_step(self, *, step, **_):
            out = _gfcr("sql", "SELECT count(*) AS n FROM steps", "--root", str(root),
                        "--format", "json")
            assert out.returncode == 0, out.stderr
            seen.append(json.loads(out.stdout)[0]["n"])

    execute(tiny_pipeline(), root=root, executor="local", hooks=[Peek()])
    assert seen == [1, 2]
