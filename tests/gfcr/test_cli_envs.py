"""``gfcr envs``: the registered environments, TextArena's games and the installed
verifiers environments (found through package metadata without importing them), with
how to use each; ``--json``; an unknown source named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gfcr.cli import app

runner = CliRunner()


def install(site: Path, name: str, requires: list[str], source: str) -> None:
    """A distribution as pip leaves it in site-packages: its module and its dist-info."""
    (site / f"{name}.py").write_text(source)
    info = site / f"{name}-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: " + name.replace("_", "-")
                                   + "\nVersion: 0.1.0\nSummary: a test environment\n"
                                   + "".join(f"Requires-Dist: {r}\n" for r in requires))
    (info / "top_level.txt").write_text(name + "\n")
    (info / "RECORD").write_text(f"{name}.py,,\n")


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    install(tmp_path, "vf_reverse_text", ["verifiers>=0.1"],
            "raise SystemExit('imported')\ndef load_environment(**kwargs):\n    pass\n")
    install(tmp_path, "vf_no_loader", ["verifiers"], "def something():\n    pass\n")
    install(tmp_path, "plain_tool", ["requests"], "def load_environment():\n    pass\n")
    install(tmp_path, "verifiers_extra", ["verifiers-extra"],  # another package's name
            "def load_environment():\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_envs_lists_every_kind_with_how_to_use_it_as_json(site: Path) -> None:
    result = runner.invoke(app, ["envs", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    by = {(e["source"], e["name"]): e for e in data["environments"]}
    assert by[("registered", "feedback")]["usage"] == 'Episodes(env="feedback")'
    assert {"gym", "remote", "textarena", "guess"} <= {n for s, n in by if s == "registered"}
    assert by[("textarena", "GuessTheNumber-v0")]["usage"] == \
        'TextArenaEnv(game="GuessTheNumber-v0")'
    assert len([k for k in by if k[0] == "textarena"]) > 100
    verifiers = [n for s, n in by if s == "verifiers"]
    assert verifiers == ["vf_reverse_text"]  # never imported: its import would exit
    assert by[("verifiers", "vf_reverse_text")]["usage"] == 'VerifiersEnv(module="vf_reverse_text")'
    assert data["problems"] == {}


def test_envs_prints_a_table_and_filters_by_source(site: Path) -> None:
    result = runner.invoke(app, ["envs", "verifiers"])
    assert result.exit_code == 0, result.output
    assert "vf_reverse_text" in result.output and "feedback" not in result.output
    result = runner.invoke(app, ["envs"])
    assert 'Episodes(env="python_tool")' in result.output and "Wordle-v0" in result.output
    result = runner.invoke(app, ["envs", "nope"])
    assert result.exit_code != 0 and "no source 'nope'" in result.output
