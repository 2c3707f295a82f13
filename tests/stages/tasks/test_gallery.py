"""The task gallery: every reasoning-gym dataset the installed reasoning-gym ships runs as
a task from its name alone.

For each dataset: ``ReasoningGym(dataset=NAME)`` with no config (the dataset's own
defaults) draws a handful of distinct training and held-out prompts; every prompt and
answer passes the run-start tokenizer check and round-trips through the tiny policy's
byte tokenizer; the dataset's scorer gives full credit to its own reference answer; and
one generate-and-score step (select, sample, verify) runs through the loop on one shared
tiny model. A few items per dataset keep the whole gallery to about a minute on 2 cores.
"""

from __future__ import annotations

import json

import pytest
from reasoning_gym.factory import DATASETS

from gfcr import Evaluation, Pipeline
from gfcr.core.rollout import col
from gfcr.runner.inprocess import local_services
from gfcr.runner.loop import Runtime, run_step
from gfcr.transport.stash import MemoryStash
from gfcr.launch.tokencheck import check_task
from stages import HF, GroupSample, ReasoningGym, TinyLlama, UniformSampler, Verify
from stages.filter.verify import ScorerFailed

CANNOT_RUN: dict[str, str] = {
    "composite": "a mixture of other datasets: its config must name them (`datasets`), so "
                 "it cannot be built from its name alone",
}
"""Datasets that cannot run from their name alone, with the reason."""

NO_REFERENCE: dict[str, str | None] = {
    "boxnet": None,
    "graph_color": "possible_answer",
    "propositional_logic": "example_answer",
    "rubiks_cube": "example_correct_answer",
    "rush_hour": None,
}
"""Datasets with no reference answer (many answers are right; the scorer checks a
solution's validity): their ``answer`` is null, so they suit RL but not an SFT warm start.
The value names the metadata key of an example solution, which must get full credit."""

GALLERY = sorted(set(DATASETS) - set(CANNOT_RUN))


@pytest.fixture(scope="module")
def shared() -> dict:
    """One tiny byte-tokenizer policy and engine for every dataset."""
    policy = TinyLlama(hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32,
                       max_position=64).build(seed=0)
    return {"policy": policy, "engine": HF(device="cpu").build(policy, seed=0)}


def test_allow_lists_name_shipped_datasets():
    assert set(CANNOT_RUN) <= set(DATASETS) and set(NO_REFERENCE) <= set(DATASETS)
    assert len(GALLERY) >= 90


@pytest.mark.parametrize("name", GALLERY)
def test_dataset_runs_from_its_name(name: str, shared: dict) -> None:
    task = ReasoningGym(dataset=name, train_size=3, heldout_size=2)
    tok = shared["policy"].tokenizer
    assert check_task(task, tok) == 5 * 2 - sum(
        r["answer"] is None for t in (task.train_prompts(), task.heldout_prompts())
        for r in t.to_pylist())
    for row in task.train_prompts().to_pylist() + task.heldout_prompts().to_pylist():
        assert row["task"] == name
        assert tok.decode(tok.encode(row["prompt"])) == row["prompt"]
        _full_credit(task, name, row)
    _one_step(task, shared)


def _full_credit(task: ReasoningGym, name: str, row: dict) -> None:
    if name in NO_REFERENCE:
        assert row["answer"] is None
        key = NO_REFERENCE[name]
        if key is not None:
            example = json.loads(row["meta"])["metadata"][key]
            solution = example if isinstance(example, str) else json.dumps(example)
            assert task.score(solution, None, row["meta"]) == 1.0
        return
    assert row["answer"] is not None
    assert task.score(row["answer"], row["answer"], row["meta"]) == 1.0


def _one_step(task: ReasoningGym, shared: dict) -> None:
    pipeline = Pipeline(name="gallery", task=task, policy=TinyLlama(), engine=HF(device="cpu"),
                        stages=[UniformSampler(batch=1), GroupSample(n=2, max_tokens=3),
                                Verify()], evaluation=Evaluation(size=2))
    engine = shared["engine"]
    rt = Runtime(pipeline=pipeline, task=task, services=local_services(
        engine, engine.policy, None), stash=MemoryStash())
    try:
        report = run_step(rt, "gallery", 0, lambda name, fn, *args: fn(*args))
    except ScorerFailed as e:
        # the dataset's own scorer raised on every rollout of the untrained policy's random
        # text (prime_factorization's int()); a step where the scorer failed on all its
        # rollouts ends the run (README: `ScorerFailed`), naming the scorer's error
        assert "the scorer failed on all 2 rollouts (first error: " in str(e), e
        return
    table = rt.stash.get(report.rollouts)
    assert table.num_rows == 2
    rewards = table.column(col.REWARD).to_pylist()
    assert all(0.0 <= r <= 1.0 for r in rewards), rewards
    # a scorer may raise on random text (prime_factorization's int()): that is recorded
    # on the rollout, as for any scorer, and the step goes on
    errors = table.column(col.SCORE_ERROR).to_pylist()
    assert all(e is None or e.split(":")[0].endswith("Error") for e in errors), errors
