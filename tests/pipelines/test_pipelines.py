"""Ready pipelines: each registered name loads, validates, round-trips through YAML, has
its headline operator, and runs shrunk steps that store the golden rows
(tests.pipelines.golden)."""

from __future__ import annotations

from importlib.metadata import entry_points

import pytest

from gfcr import Pipeline
from gfcr.core.loading import load
from gfcr.launch.run import execute
from tests.pipelines import golden
from stages import (D3S, DOTS, VADE, ActivePartialRollouts, ConditionedSample, CrossRunReplay,
                    DynamicSampling, InSight, OnlinePrune, Overlong, PromptGDRO,
                    RecyclePartials, ResampleOnCorrect, RolloutAllocator, RolloutReplay,
                    TinyLlama, TokenBudget, TreeRollout)

HEADLINES = {
    "latr": [TreeRollout],
    "dapo": [Overlong, DynamicSampling],
    "roc": [ResampleOnCorrect],
    "d3s": [D3S],
    "hints": [ConditionedSample],
    "april": [RecyclePartials, ActivePartialRollouts],
    "arrol": [OnlinePrune],
    "budget": [TokenBudget, RolloutAllocator],
    "allocate": [RolloutAllocator],
    "rollout_replay": [RolloutReplay],
    "dots_rr": [DOTS, RolloutReplay],
    "insight": [InSight],
    "vade": [VADE],
    "prompt_gdro": [PromptGDRO],
    "cross_run": [CrossRunReplay],
    "smol": [DynamicSampling],  # its policy (SmolLM2) is tests/stages/engines/test_smollm2.py's
    "smol-long": [DynamicSampling],  # its composite task is test_reasoning_gym.py's
}
NEEDS_SOURCE = {"cross_run"}
"""Pipelines that read another store: run in their own test, with a source store."""
SELECTORS = {"insight", "vade", "dots", "prompt_gdro"}


def test_every_ready_pipeline_is_registered():
    names = {ep.name for ep in entry_points(group="gfcr.pipelines")}
    assert set(HEADLINES) <= names


@pytest.mark.parametrize("name", sorted(HEADLINES))
def test_ready_pipeline_loads_validates_and_round_trips(name):
    p = load(name)
    assert p.name == name
    assert Pipeline.from_yaml(p.to_yaml()).spec_hash() == p.spec_hash()
    kinds = {type(s) for s in p.stages}
    assert set(HEADLINES[name]) <= kinds


def _shrunk(p: Pipeline) -> Pipeline:
    """The same stages on a 2-prompt batch, a 1-layer policy, no warm start, the golden
    runs' steps."""
    data = p.to_dict()
    data.update(steps=golden.STEPS, warmstart=None,
                policy=TinyLlama(hidden_size=32, num_layers=1, num_heads=2,
                                 intermediate_size=64).model_dump())
    data["task"]["train_size"], data["task"]["heldout_size"] = 64, 8
    data["evaluation"]["size"] = 4
    for s in data["stages"]:
        if s["type"] == "uniform" or s["type"] in SELECTORS:
            s["batch"] = 2
        if s["type"] == "rollout_replay":
            s["groups"] = 2
        if s["type"] == "dynamic_sampling" and s["mode"] == "refill":
            s["min_groups"], s["max_rounds"] = 2, 1
        if s["type"] == "rollout_allocator":
            s["budget"] = 2 * s["min_n"] + 1
    return Pipeline(**data)


@pytest.mark.parametrize("name", ["default", *sorted(set(HEADLINES) - NEEDS_SOURCE)])
def test_ready_pipeline_runs_and_stores_the_golden_rows(name, tmp_path):
    summary = execute(_shrunk(load(name)), root=tmp_path, executor="local",
                      run_id=golden.RUN_ID)
    assert summary.steps == golden.STEPS and summary.rollouts > 0
    golden.check("hf", name, tmp_path / "store")


def test_cross_run_pipeline_runs_a_step_replaying_another_store(tmp_path):
    from store import RolloutStore
    from tests.store.conftest import make_rollouts

    with RolloutStore.open(tmp_path / "source") as source:
        source.commit_step("earlier", 0, make_rollouts(8, run_id="earlier"), policy_version=3,
                           metrics={})
    p = _shrunk(load("cross_run")).with_overrides([f"cross_run_replay.source={tmp_path / 'source'}"])
    summary = execute(p, root=tmp_path / "run", executor="local", run_id=golden.RUN_ID)
    assert summary.steps == golden.STEPS and summary.history[0]["replay/rows"] == 8
    golden.check("hf", "cross_run", tmp_path / "run" / "store")
    with RolloutStore.open(tmp_path / "run" / "store", read_only=True) as s:
        rows = s.sql("SELECT parent_id, replay_source FROM rollouts WHERE replay_count > 0").to_pylist()
    assert {r["parent_id"] for r in rows} == {f"earlier/0/{i}" for i in range(8)}
    assert {r["replay_source"] for r in rows} == {f"{tmp_path / 'source'}#earlier"}
