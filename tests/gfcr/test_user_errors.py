"""Every user error of issue 12 item 6 is one paragraph with exit code 2 naming the path or
field, found before any work starts; a run never writes outside its root."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PIPELINE_FILE = """
from tests.conftest import tiny_pipeline
pipeline = tiny_pipeline(steps=1)
"""
NEEDS_USERNS = pytest.mark.skipif(
    shutil.which("unshare") is None or subprocess.run(
        ["unshare", "-Urm", "true"], capture_output=True).returncode != 0,
    reason="unprivileged user and mount namespaces are unavailable (unshare -Urm)")


@pytest.fixture
def pipeline_file(tmp_path):
    path = tmp_path / "p.py"
    path.write_text(PIPELINE_FILE)
    return path


def _gfcr(*args, cwd=None, prefix=()):
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}  # tests.conftest
    return subprocess.run([*prefix, sys.executable, "-m", "gfcr.cli", *args], capture_output=True,
                          text=True, timeout=600, cwd=cwd, env=env)


def _invoke(*args):
    """In this process (the value checks need no subprocess): exit code and output."""
    from typer.testing import CliRunner

    from gfcr.cli import app

    result = CliRunner().invoke(app, list(args))
    return subprocess.CompletedProcess(args, result.exit_code, "", result.output)


def _one_paragraph(result, *needles):
    assert result.returncode == 2, result.stderr[-3000:]
    # one paragraph: no blank line inside it (a progress display may end with one)
    assert "Traceback" not in result.stderr and result.stderr.strip().count("\n\n") == 0
    text = " ".join(result.stderr.split())
    for needle in needles:
        assert needle in text, text


@pytest.mark.parametrize("assignment, needles", [
    ("seed=-1", ["'seed'", "greater than or equal to 0"]),
    ("seed=4294967296", ["'seed'", "less than 4294967296"]),
    ("grpo.lr=[1, 2", ["'grpo.lr'", "is not valid YAML"]),
    ("name=../../x", ["'name'", "may hold only letters"]),
    ("name=/tmp/x", ["'name'", "may hold only letters"]),
    ("group.name=../g", ["name", "may hold only letters"]),
])
def test_bad_values_are_refused_before_any_work(tmp_path, pipeline_file, assignment, needles):
    root = tmp_path / "root"
    result = _invoke("run", str(pipeline_file), "--root", str(root), "--executor", "local",
                     "--set", assignment)
    _one_paragraph(result, *needles)
    assert not root.exists()


@pytest.mark.parametrize("run_id", ["../x", "/abs/path", "a/b", ".hidden"])
def test_run_ids_are_validated(tmp_path, run_id):
    result = _invoke("run", "--resume", run_id, "--root", str(tmp_path / "root"))
    _one_paragraph(result, f"run id {run_id!r} may hold only letters")
    assert not (tmp_path / "root").exists()


@NEEDS_USERNS
def test_a_read_only_root_names_the_path(tmp_path, pipeline_file):
    from store import RolloutStore

    root = tmp_path / "root"
    RolloutStore.open(root / "store").close()
    ro = ("unshare", "-Urm", "sh", "-c",
          f'mount --bind "{root}" "{root}" && mount -o remount,bind,ro "{root}" && exec "$0" "$@"')
    result = _gfcr("run", str(pipeline_file), "--root", str(root), "--executor", "local",
                   prefix=ro)
    _one_paragraph(result, str(root))


@NEEDS_USERNS
def test_a_full_disk_names_the_path(tmp_path, pipeline_file):
    root = tmp_path / "root"
    root.mkdir()
    full = ("unshare", "-Urm", "sh", "-c",
            f'mount -t tmpfs -o size=256k tmpfs "{root}" && exec "$0" "$@"')
    result = _gfcr("run", str(pipeline_file), "--root", str(root), "--executor", "local",
                   prefix=full)
    _one_paragraph(result, "the disk is full", str(root))


def test_a_run_writes_nothing_outside_its_root(tmp_path, pipeline_file):
    (tmp_path / "cwd").mkdir()
    result = _gfcr("run", str(pipeline_file), "--root", "../root", "--executor", "local",
                   "--no-track", cwd=tmp_path / "cwd")
    assert result.returncode == 0, result.stderr[-3000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cwd", "p.py", "root"]
    assert list((tmp_path / "cwd").iterdir()) == []


@NEEDS_USERNS
def test_a_full_disk_is_blamed_on_what_was_full_not_mlflow(tmp_path):
    """Issue 26 item 8: under --no-track a full disk was blamed on `mlflow.db` (the lease
    database's SQLite error, raised while the run stopped, was taken for MLflow's)."""
    (tmp_path / "p.py").write_text(PIPELINE_FILE.replace("steps=1", "steps=60"))
    root = tmp_path / "root"
    root.mkdir()
    full = ("unshare", "-Urm", "sh", "-c",
            f'mount -t tmpfs -o size=600k tmpfs "{root}" && exec "$0" "$@"')
    result = _gfcr("run", str(tmp_path / "p.py"), "--root", str(root), "--executor", "local",
                   "--no-track", prefix=full)
    _one_paragraph(result, "the disk is full", str(root))
    assert "mlflow" not in result.stderr.lower()
