"""tools/imports.py, the import gate CI runs: a module named by a string (run with ``python
-m``, imported by vLLM as a worker extension) is an edge, so a cycle through one fails
``--strict`` like a cycle through import statements."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parents[1] / "tools" / "imports.py"


@pytest.fixture()
def tool():
    spec = importlib.util.spec_from_file_location("imports_tool", TOOL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _tree(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_a_cycle_through_a_module_named_by_a_string_fails_strict(tool, tmp_path, capsys):
    _tree(tmp_path, {
        "gfcr/__init__.py": "", "store/__init__.py": "", "stages/__init__.py": "",
        "gfcr/launcher.py": 'import sys\nARGV = [sys.executable, "-m", "stages.program"]\n',
        "stages/program.py": "from gfcr import launcher\n",
        "stages/ext.py": 'HOOK = "gfcr.hooks.Hook"\nRUN = "gfcr.hooks:run"\n',
        "gfcr/hooks.py": '"""Prose naming stages.program is no edge."""\nGROUP = "gfcr.store"\n'})
    tool.ROOT = tmp_path
    edges = tool.graph()
    assert edges["gfcr.launcher"] == {"stages.program"}
    assert edges["stages.ext"] == {"gfcr.hooks"}
    assert edges["gfcr.hooks"] == set()  # a docstring, an entry point group
    assert tool.main(["--strict"]) == 1
    assert "CYCLE: gfcr.launcher <-> stages.program" in capsys.readouterr().out


def test_the_rank_program_and_the_fleet_extension_are_gfcr_edges(tool):
    edges = tool.graph()
    assert "gfcr.transport.sharded_rank" in edges["gfcr.transport.sharded_ranks"]
    assert "gfcr.transport.fleet_extension" in edges["gfcr.transport.fleet_serve"]
    assert not any(t.startswith("stages") for s, ts in edges.items() if s.startswith("gfcr")
                   for t in ts)
    assert tool.main(["--strict"]) == 0
