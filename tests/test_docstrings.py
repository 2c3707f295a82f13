"""The docstring examples (``>>>``) of gfcr, stages, store and pipelines run, so an example
a reader copies cannot go stale. An example that needs what a test machine lacks is marked
``# doctest: +SKIP`` where it stands."""

from __future__ import annotations

import doctest
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("gfcr", "stages", "store", "pipelines")


def _modules() -> list[str]:
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if ">>>" in path.read_text(encoding="utf-8"):
                found.append(".".join(path.relative_to(ROOT).with_suffix("").parts))
    return found


MODULES = _modules()


def test_the_packages_have_examples_to_run():
    assert len(MODULES) >= 30


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name: str) -> None:
    module = importlib.import_module(name)
    flags = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    runner = doctest.DocTestRunner(optionflags=flags)
    report: list[str] = []
    for test in doctest.DocTestFinder().find(module, name):
        runner.run(test, out=report.append)
    failed = sum(1 for line in report if "Failed example" in line)
    assert failed == 0, f"{name}: docstring examples failed:\n" + "".join(report)[:3000]
