"""Every ready pipeline runs a step on the vLLM engine (vLLM's CPU build here), unchanged
but for the engine and a policy shape vLLM's CPU attention runs (head size 32).

Each run starts its own ``vllm.LLM`` (in-process; the import is paid once per session)."""

from __future__ import annotations

from typing import Any

import pytest

from gfcr import Pipeline
from gfcr.loading import load
from gfcr.run import execute
from tests.pipelines.test_pipelines import HEADLINES, NEEDS_SOURCE, _shrunk
from tests.resources.vllm import VLLM_POLICY, vllm_engine_spec


def _on_vllm(p: Pipeline) -> Pipeline:
    data: dict[str, Any] = _shrunk(p).to_dict()
    data["policy"] = VLLM_POLICY.model_dump()
    data["engine"] = vllm_engine_spec().model_dump()
    return Pipeline(**data)


@pytest.mark.parametrize("name", ["default", *sorted(set(HEADLINES) - NEEDS_SOURCE)])
def test_ready_pipeline_runs_a_step_on_vllm(name: str, tmp_path: Any) -> None:
    summary = execute(_on_vllm(load(name)), root=tmp_path, executor="local")
    assert summary.steps == 1 and summary.rollouts > 0


def test_cross_run_pipeline_runs_a_step_on_vllm(tmp_path: Any) -> None:
    from store import RolloutStore
    from tests.store.conftest import make_rollouts

    with RolloutStore.open(tmp_path / "source") as source:
        source.commit_step("earlier", 0, make_rollouts(8, run_id="earlier"), policy_version=3,
                           metrics={})
    p = _on_vllm(load("cross_run")).with_overrides(
        [f"cross_run_replay.source={tmp_path / 'source'}"])
    summary = execute(p, root=tmp_path / "run", executor="local")
    assert summary.steps == 1 and summary.history[0]["replay/rows"] == 8


def test_engine_can_be_chosen_from_the_command_line_spelling() -> None:
    p = load("default").with_overrides(["engine=vllm"])
    assert p.engine.type == "vllm" and p.engine.model_dump()["dtype"] == "float32"
