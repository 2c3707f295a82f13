"""Token budgets (DUET): the split into per-sample caps, the abort rule on hand-built
flights, and both through the real loop."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from gfcr.core.engine import Flight, Inflight
from gfcr.core.rollout import col
from gfcr.launch.run import execute
from stages import GroupSample, TokenBudget, UniformSampler, Verify
from stages.control.budget import token_caps
from store import RolloutStore
from tests.conftest import tiny_pipeline
from tests.resources.rollouts import context
from tests.stages.control.test_allocate import History


def test_token_caps_fill_the_budget_within_bounds():
    caps = token_caps(np.array([1.0, 1.0, 2.0]), np.full(3, 4.0), np.full(3, 16.0), 100, 2)
    assert caps.tolist() == [6, 6, 13] and (4 * caps).sum() == 100
    roomy = token_caps(np.array([1.0, 10.0]), np.full(2, 2.0), np.full(2, 8.0), 100, 2)
    assert roomy.tolist() == [8, 8]  # the generator's cap binds
    tight = token_caps(np.ones(2), np.full(2, 4.0), np.full(2, 16.0), 5, 2)
    assert tight.tolist() == [2, 2]  # min_tokens wins over the budget; abort catches it


def test_informative_split_gives_uncertain_prompts_longer_caps():
    plan = pa.table({col.PROMPT_ID: ["easy", "mid", "new"], "n": pa.array([4, 4, 4]),
                     "max_tokens": pa.array([32, 32, 32])})
    ctx = context(history=History({"easy": (19, 1), "mid": (6, 4)}))
    caps = TokenBudget(budget=200, min_tokens=2).allocate(ctx, plan)
    easy, mid, new = caps.column("max_tokens").to_pylist()
    assert easy < mid <= new and 4 * (easy + mid + new) <= 200
    same = TokenBudget(budget=200, split="uniform").allocate(ctx, plan)
    assert same.column("max_tokens").to_pylist() == [16, 16, 16]
    off = TokenBudget(budget=200, split="off").allocate(ctx, plan)
    assert off.column("max_tokens").to_pylist() == [32, 32, 32]


def _ctx(spent_per_key):
    ctx = context()
    ctx.flight = Flight(tokens=dict(spent_per_key))
    return ctx


@pytest.mark.parametrize("abort, decision", [("prune", "prune"), ("stop", "stop"),
                                             ("off", None)])
def test_abort_once_the_step_has_spent_its_budget(abort, decision):
    views = [Inflight(key=k, completion_ids=[1] * 5, logprobs=[-1.0] * 5, new_tokens=5)
             for k in (1, 2)]
    stage = TokenBudget(budget=20, abort=abort)
    assert stage.on_segment(_ctx({0: 9, 1: 5, 2: 5}), views) == {}
    expected = {} if decision is None else {1: decision, 2: decision}
    assert stage.on_segment(_ctx({0: 10, 1: 5, 2: 5}), views) == expected
    assert ("stop" in stage.owns) == (abort == "stop")


def _run(tmp_path, budget):
    p = tiny_pipeline(steps=1, stages=[
        UniformSampler(batch=4), budget, GroupSample(n=4, max_tokens=16, segment_tokens=2),
        Verify()])
    summary = execute(p, root=tmp_path, executor="local")
    with RolloutStore.open(tmp_path / "store", read_only=True) as s:
        return s.sql("SELECT * FROM rollouts WHERE run_id = $r",
                     {"r": summary.run_id}).to_pylist()


def test_through_the_loop_caps_bound_the_step_and_the_abort_prunes(tmp_path):
    capped = _run(tmp_path / "a", TokenBudget(budget=64, split="uniform", min_tokens=2))
    assert sum(r[col.N_TOKENS] for r in capped) <= 64
    assert max(r[col.N_TOKENS] for r in capped) <= 4 and all(
        r[col.STATUS] == "complete" for r in capped)
    aborted = _run(tmp_path / "b", TokenBudget(budget=40, split="off", abort="prune"))
    # 16 sequences: at most 32 tokens after one segment, 64 after two -> pruned then
    assert 40 <= sum(r[col.N_TOKENS] for r in aborted) <= 64
    pruned = [r for r in aborted if r[col.STATUS] == "pruned"]
    assert pruned and {(r[col.N_TOKENS], r[col.DROP_REASON]) for r in pruned} == {(4, "pruned")}
