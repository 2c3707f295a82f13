"""One placement for a run's generator, learner and scorer (gfcr.launch.placement):
given by the pipeline, a placement file, ``gfcr run``'s flags or Python, settled once
before the run starts by one rule (a setting takes the one value its sources give; two
different values are refused, naming both sources)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from gfcr import execute
from gfcr.core.settings import LearnerPlacement
from gfcr.launch.placement import (Placement, PlacementConflict, PlacementError, explicit,
                                   merge, of_file, of_flags, settle)
from gfcr.launch.request import RunRequest, resolve, settled
from gfcr.transport.fleet import Fleet
from gfcr.transport.remote.pool import WorkerPool
from tests.conftest import tiny_pipeline

URL = "http://127.0.0.1:8000"


def _file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "placement.yaml"
    path.write_text(text)
    return path


def test_the_sources_settle_into_one_placement(tmp_path: Path) -> None:
    file = of_file(_file(tmp_path, "generator: {urls: ['%s'], keep: 5}\n"
                                   "scorer: {pool: cpu}\n" % URL))
    placement = merge([file, of_flags([URL], None, 30.0, file)])
    assert placement == Placement(generator=Fleet(urls=(URL,), keep=5, timeout_s=30.0),
                                  scorer=WorkerPool(pool="cpu", timeout_s=30.0))
    assert merge([]) == Placement()  # every service in this process


def test_two_sources_that_disagree_are_refused_naming_both(tmp_path: Path) -> None:
    path = _file(tmp_path, "scorer: {pool: gpu}\n")
    with pytest.raises(PlacementConflict) as err:
        merge([of_file(path), of_flags([], "cpu", None)])
    said = str(err.value)
    assert "scorer.pool is 'gpu' by placement file" in said and str(path) in said
    assert "'cpu' by gfcr run's flags" in said
    with pytest.raises(PlacementConflict, match="generator is in this process by python"):
        merge([("python", {"generator": None}), of_flags([URL], None, None)])


def test_the_pipeline_is_a_source_and_carries_the_settled_learner(tmp_path: Path) -> None:
    pipeline = tiny_pipeline(steps=1)
    sharded = ("FILE", {"learner": {"ranks": 2, "device": "cpu"}})
    spec, placement = settle(pipeline, [sharded])
    assert placement.learner == LearnerPlacement(ranks=2, device="cpu") == spec.learner
    assert spec.spec_hash() != pipeline.spec_hash()  # where the learner ran is in the spec
    assert settle(spec, [sharded])[0].spec_hash() == spec.spec_hash()  # the same value twice
    with pytest.raises(PlacementConflict, match=r"learner.ranks is 2 by the pipeline.*4 by FILE"):
        settle(spec, [("FILE", {"learner": {"ranks": 4}})])


def test_a_bad_placement_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(PlacementError, match="placement file .*placement.yaml.*gpus"):
        of_file(_file(tmp_path, "gpus: 2\n"))
    with pytest.raises(PlacementError, match="placement file .*listed twice"):
        of_file(_file(tmp_path, "generator: {urls: ['%s', '%s']}\n" % (URL, URL)))


def test_a_request_is_resolved_once_and_travels_settled(tmp_path: Path) -> None:
    pipeline = tmp_path / "tiny.py"
    pipeline.write_text("from tests.conftest import tiny_pipeline\n"
                        "pipeline = tiny_pipeline(steps=1)\n")
    request = RunRequest(pipeline=str(pipeline), overrides=("steps=3",), root=str(tmp_path))
    launch = resolve(request, None, [of_flags([URL], None, 20.0)])
    assert launch.pipeline.steps == 3 and launch.placement.generator == Fleet(
        urls=(URL,), timeout_s=20.0)
    plain = settled(launch)  # what the flow gets: the checked spec, no overrides
    assert plain.overrides == () and plain.run_id == launch.run_id
    crossed = RunRequest.model_validate(plain.model_dump(mode="json"))  # Prefect's parameters
    assert explicit(crossed.placement) == explicit(plain.placement)  # defaults stay defaults
    assert RunRequest().model_dump(mode="json")["placement"] == {}
    again = resolve(crossed, None)
    assert again.pipeline.spec_hash() == launch.pipeline.spec_hash()
    assert (again.placement, again.run_id) == (launch.placement, launch.run_id)


def test_execute_refuses_a_conflict_before_anything_is_written(tmp_path: Path) -> None:
    pipeline = tiny_pipeline(steps=1).model_copy(
        update={"learner": LearnerPlacement(ranks=1)})
    with pytest.raises(PlacementConflict, match=r"execute\(placement=...\)"):
        execute(pipeline, root=tmp_path, executor="local",
                placement=Placement(learner=LearnerPlacement(ranks=2)))
    assert list(tmp_path.iterdir()) == []


def test_gfcr_run_names_the_conflicting_flag_and_file(tmp_path: Path) -> None:
    from gfcr.cli import app

    path = _file(tmp_path, "generator: {urls: ['http://127.0.0.1:9000']}\n")
    root = tmp_path / "root"
    result = CliRunner().invoke(app, ["run", "--root", str(root), "--executor", "local",
                                      "--placement", str(path), "--fleet", URL])
    said = " ".join(result.output.split())
    assert result.exit_code == 2, said
    assert "generator.urls" in said and "placement file" in said and "--fleet" in said, said
    assert not root.exists()  # refused before the run began
