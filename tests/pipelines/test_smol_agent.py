"""The ``smol-agent`` pipelines on SmolLM2: the python_tool environment (Episodes) and
the openai-client agent calling the tool through gfcr's endpoint (AgentEnv), each one
GRPO step end to end from a one-step demonstration warm start, a few tokens per turn:
they load, round-trip, train, store their turns and the step's tool figures."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gfcr import Pipeline
from gfcr.launch.run import execute
from pipelines.smol_agent import DEMOS
from pipelines.smol_agent import pipeline as episodes_pipeline
from pipelines.smol_agent_openai import pipeline as openai_pipeline
from stages import SFT, AgentEnv, Episodes
from store import RolloutStore
from tests.resources.agents import needs_openai
from tests.resources.smol import smol_root

TOOL_METRICS = {"tool/call_rate", "tool/error_rate", "tool/calls", "tool/success"}


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return smol_root(tmp_path_factory)


def _small(p: Pipeline, generate: str, root: Path) -> Pipeline:
    """One step of one prompt, two episodes of 8-token turns, a one-step warm start."""
    data = p.with_overrides([
        "steps=1", "uniform.batch=1", f"{generate}.n=2", f"{generate}.max_tokens=8",
        "task.train_size=4", "task.heldout_size=2", "evaluation.size=1",
        "evaluation.max_tokens=2", "checkpoint.every=0", f"policy.root={root.resolve()}"]).to_dict()
    data["warmstart"] = SFT(steps=1, batch_size=1, demonstrations=DEMOS).model_dump()
    return Pipeline(**data)


@pytest.mark.parametrize("p, kind", [(episodes_pipeline, Episodes), (openai_pipeline, AgentEnv)])
def test_the_pipelines_round_trip_with_the_demonstration_warm_start(p: Pipeline, kind: Any) -> None:
    assert Pipeline.from_yaml(p.to_yaml()).spec_hash() == p.spec_hash()
    assert isinstance(p.stages[1], kind) and p.warmstart.demonstrations == DEMOS  # type: ignore[union-attr]


def _one_step(p: Pipeline, tmp_path: Path) -> tuple[Any, list[dict[str, Any]]]:
    summary = execute(p, root=tmp_path, executor="local")
    with RolloutStore.open(tmp_path / "store", read_only=True) as s:
        rows = s.sql(f"SELECT turns, reward FROM rollouts WHERE run_id = '{summary.run_id}'"
                     ).to_pylist()
    return summary, rows


def test_smol_agent_runs_a_step_against_the_python_tool(root: Path, tmp_path: Path) -> None:
    summary, rows = _one_step(_small(episodes_pipeline, "episodes", root), tmp_path)
    assert summary.steps == 1 and len(rows) == 2
    assert TOOL_METRICS <= set(summary.history[0])
    assert all(r["turns"][0]["source"] == "environment" for r in rows)
    assert all(r["turns"][1]["source"] == "policy" for r in rows)


def test_smol_agent_openai_runs_a_step_through_the_endpoint(root: Path, tmp_path: Path) -> None:
    needs_openai()
    summary, rows = _one_step(_small(openai_pipeline, "agent", root), tmp_path)
    assert summary.steps == 1 and len(rows) >= 2
    assert TOOL_METRICS <= set(summary.history[0])
    assert all(r["reward"] in (0.0, 1.0) for r in rows)
