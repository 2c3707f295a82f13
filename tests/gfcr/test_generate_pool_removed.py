"""The engine-worker generate path was removed (issue 24): ``gfcr run --generate-pool``,
a run request's ``generate_pool`` and ``execute(generate_pool=POOL)`` fail at once with
an error that names the fleet replacing it, before anything is written (a fleet is
now given as ``placement=Placement(generator=Fleet(...))``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from gfcr import execute
from gfcr.launch.placement import GeneratePoolRemoved
from gfcr.transport.fleet import Fleet
from gfcr.transport.remote.pool import WorkerPool
from tests.conftest import tiny_pipeline

NAMES_THE_FLEET = r"was removed \(issue 24\).*gfcr engine serve.*--fleet URL"


def test_gfcr_run_with_a_generate_pool_fails_naming_the_fleet(tmp_path: Path) -> None:
    from gfcr.cli import app

    result = CliRunner().invoke(app, ["run", "--generate-pool", "gpu", "--root",
                                      str(tmp_path), "--executor", "local"])
    assert result.exit_code == 2
    said = " ".join(result.output.replace("│", " ").split())
    assert "Invalid value for '--generate-pool'" in said, said
    assert "the engine-worker generate path" in said and "--fleet URL" in said, said
    assert "gfcr engine serve" in said, said
    assert list(tmp_path.iterdir()) == []  # refused before the run began
    helped = CliRunner().invoke(app, ["run", "--help"])
    assert "--generate-pool" not in helped.output and "--fleet" in helped.output


def test_execute_with_a_generate_pool_fails_naming_the_fleet(tmp_path: Path) -> None:
    for pool in ("gpu", WorkerPool(pool="gpu"), Fleet(urls=("http://a:1",))):
        with pytest.raises(GeneratePoolRemoved, match=NAMES_THE_FLEET):
            execute(tiny_pipeline(steps=1), root=tmp_path, executor="local",
                    generate_pool=pool)
    assert list(tmp_path.iterdir()) == []


def test_a_run_request_with_a_generate_pool_fails_naming_the_fleet() -> None:
    from gfcr.launch.flow import RunRequest

    with pytest.raises(ValidationError, match=NAMES_THE_FLEET):
        RunRequest(generate_pool="gpu")
