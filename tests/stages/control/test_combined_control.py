"""Every Control operator of issue 5, and partial-rollout recycling, in one pipeline."""

from __future__ import annotations

from gfcr.core.rollout import col
from gfcr.launch.run import execute
from stages import (GRPO, ActivePartialRollouts, GroupSample, OnlinePrune, RecyclePartials,
                    RolloutAllocator, TokenBudget, UniformSampler, Verify)
from stages.replay.recycle import recycle_counts
from store import RolloutStore
from tests.conftest import tiny_pipeline
from tests.resources.control import DIGITS
from tests.resources.digits import Digits


def test_allocate_budget_april_and_pruning_together(tmp_path):
    p = tiny_pipeline(task=Digits(), steps=3, stages=[
        RecyclePartials(), UniformSampler(batch=6),
        RolloutAllocator(budget=22, rule="sqrt", min_n=2, max_n=6),
        TokenBudget(budget=300, split="informative", min_tokens=4, abort="prune"),
        ActivePartialRollouts(over_provision=1.5),
        OnlinePrune(min_tokens=4, margin=0.0, min_examples=8),
        GroupSample(n=4, max_tokens=24, segment_tokens=2, stop=DIGITS),
        Verify(), GRPO(lr=1e-3)])
    summary = execute(p, root=tmp_path, executor="local")
    with RolloutStore.open(tmp_path / "store", read_only=True) as s:
        rows = s.sql("SELECT * FROM rollouts WHERE run_id = $r",
                     {"r": summary.run_id}).to_pylist()
        counts = recycle_counts(s, summary.run_id)
    for step in range(3):
        fresh = [r for r in rows if r[col.STEP] == step and r[col.PARENT_ID] is None]
        assert len(fresh) == 22  # the allocator's budget, recycled groups aside
    statuses = {r[col.STATUS] for r in rows}
    assert {"complete", "partial"} <= statuses
    pruned = sum(r[col.STATUS] == "pruned" for r in rows)
    assert counts["discarded"] == pruned  # pruned on purpose: ARRoL or the token budget
    trained = [r for r in rows if r[col.CONSUMED_AT_STEP] is not None]
    assert trained and all(r[col.STATUS] == "complete" for r in trained)
