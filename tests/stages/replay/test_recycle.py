"""Partial rollouts through the real loop and store: stopped (APRIL), stored as partial,
continued first in the next step, trained with their whole group; nothing discarded,
nothing stopped ever scored, stale groups restarted on record."""

from __future__ import annotations

from collections import Counter

import pytest

from gfcr.core.rollout import col
from gfcr.core.stage import StepContext
from gfcr.launch.run import execute
from stages import RecyclePartials
from stages.generate.rows import RECYCLE
from stages.replay.recycle import pending_partials, recycle_counts, recycled_plan
from store import LakeHistory, RolloutStore
from tests.resources import control
from tests.resources.control import april_pipeline
from tests.resources.digits import Digits


def _stored(root, run_id):
    with RolloutStore.open(root / "store", read_only=True) as s:
        rows = s.sql("SELECT * FROM rollouts WHERE run_id = $r ORDER BY step, group_id, "
                     "sample_idx", {"r": run_id}).to_pylist()
        return rows, recycle_counts(s, run_id)


def test_partials_round_trip_nothing_discarded_nothing_stopped_scored(tmp_path):
    control.SCORED.clear()
    summary = execute(april_pipeline(steps=3), root=tmp_path, executor="local")
    rows, counts = _stored(tmp_path, summary.run_id)
    by_id = {r[col.ROLLOUT_ID]: r for r in rows}
    children = {r[col.PARENT_ID] for r in rows if r[col.PARENT_ID]}
    partial = [r for r in rows if r[col.STATUS] == "partial"]
    assert partial and counts["continued"] and counts["carried"]
    for r in rows:  # every generated sequence: trained, or partial and continued later
        if r[col.STATUS] == "complete":
            assert r[col.KEPT] and r[col.CONSUMED_AT_STEP] == r[col.STEP]
        else:
            assert r[col.STATUS] == "partial" and r[col.REWARD] is None
            assert (r[col.DROPPED_BY], r[col.DROP_REASON]) == ("group", "partial")
            assert r[col.ROLLOUT_ID] in children or r[col.STEP] == 2
    assert counts["discarded"] == counts["restarted"] == 0
    assert counts["pending"] == sum(r[col.STEP] == 2 for r in partial)
    # in-flight scoring is never started for a stopped rollout (slime #2176)
    complete = [r[col.COMPLETION] for r in rows if r[col.STATUS] == "complete"]
    assert Counter(control.SCORED) == Counter(complete)
    for r in rows:
        if r[col.PARENT_ID]:
            _check_continuation(r, by_id[r[col.PARENT_ID]])
    for group in {r[col.GROUP_ID] for r in rows if r[col.PARENT_ID]}:
        again = [r for r in rows if r[col.GROUP_ID] == group and r[col.PARENT_ID]]
        assert len(again) == 4 and len({r[col.STEP] for r in again}) == 1  # back whole
        assert len({r[col.STATUS] for r in again}) == 1  # trained together, or held together


def _check_continuation(row, parent):
    """Loss masks stay aligned: the parent's tokens and logprobs, then the new ones."""
    n = len(parent[col.COMPLETION_IDS])
    assert row[col.COMPLETION_IDS][:n] == parent[col.COMPLETION_IDS]
    assert row[col.LOGPROBS][:n] == pytest.approx(parent[col.LOGPROBS])
    assert len(row[col.COMPLETION_IDS]) == len(row[col.LOGPROBS]) == row[col.N_TOKENS]
    if parent[col.FINISH_REASON] != "aborted":  # a finished sibling: carried unchanged
        assert row[col.COMPLETION_IDS] == parent[col.COMPLETION_IDS]
        assert row[col.FINISH_REASON] == parent[col.FINISH_REASON]
    assert row[col.POLICY_VERSION_START] == parent[col.POLICY_VERSION_START]
    assert (row[col.GROUP_ID], row[col.SAMPLE_IDX], row[col.STEP]) == (
        parent[col.GROUP_ID], parent[col.SAMPLE_IDX], parent[col.STEP] + 1)


def test_recycled_groups_come_first_in_the_plan(tmp_path):
    summary = execute(april_pipeline(steps=2), root=tmp_path, executor="local")
    with RolloutStore.open(tmp_path / "store", read_only=True) as s:
        history = LakeHistory(s, summary.run_id, as_of_step=1)
        pending = pending_partials(history, summary.run_id)
        ctx = StepContext(run_id=summary.run_id, step=2, seed=0, policy_version=2,
                          task=Digits(), history=history)
        plan = RecyclePartials().select(ctx, control.april_pipeline().task.train_prompts()
                                        .slice(0, 2))
    groups = list(dict.fromkeys(pending.column(col.GROUP_ID).to_pylist()))
    assert groups, "step 1 must leave partials"
    assert plan.column(col.GROUP_ID).to_pylist() == groups + [None, None]
    recycled = plan.column(RECYCLE).to_pylist()[:len(groups)]
    parents = sorted(s["parent_id"] for samples in recycled for s in samples)
    assert parents == sorted(pending.column(col.ROLLOUT_ID).to_pylist())
    assert plan.column("n").to_pylist()[:len(groups)] == [len(s) for s in recycled]
    assert plan.slice(len(groups)).column(RECYCLE).null_count == 2


def test_stale_groups_are_restarted_on_record(tmp_path):
    summary = execute(april_pipeline(steps=2, max_staleness=0), root=tmp_path,
                      executor="local")
    rows, counts = _stored(tmp_path, summary.run_id)
    held = [r for r in rows if r[col.STEP] == 0 and r[col.STATUS] == "partial"]
    assert held and counts["restarted"] == len(held)
    assert counts["continued"] == counts["carried"] == 0
    restarted = [r for r in rows if r[col.PARENT_ID]]
    assert {r[col.PARENT_ID] for r in restarted} == {r[col.ROLLOUT_ID] for r in held}
    assert {r[col.POLICY_VERSION_START] for r in restarted} == {1}  # fresh: version 1


def test_plan_of_hand_built_partials_continue_carry_or_restart():
    def row(idx, reason, start):
        return {col.STEP: 0, col.ROLLOUT_ID: f"r{idx}", col.GROUP_ID: "g", col.SAMPLE_IDX: idx,
                col.PROMPT_ID: "p", col.TASK: "t", col.PROMPT: "q", col.ANSWER: None,
                col.META: None, col.COMPLETION_IDS: [5, 6], col.LOGPROBS: [-1.0, -2.0],
                col.POLICY_VERSION_START: start, col.POLICY_VERSION_END: start,
                col.FINISH_REASON: reason}
    rows = [row(0, "aborted", 3), row(1, "stop", 3)]
    (fresh,) = recycled_plan(rows, version=5, max_staleness=2).to_pylist()
    assert fresh[col.GROUP_ID] == "g" and fresh["n"] == 2
    cont, carry = fresh[RECYCLE]
    assert (cont["prefix_ids"], cont["finish_reason"], cont["parent_id"]) == ([5, 6], None, "r0")
    assert (carry["finish_reason"], carry["policy_version_end"]) == ("stop", 3)
    (stale,) = recycled_plan(rows, version=6, max_staleness=2).to_pylist()
    assert all(s["prefix_ids"] == [] and s["policy_version_start"] is None
               and s["finish_reason"] is None for s in stale[RECYCLE])
    assert [s["parent_id"] for s in stale[RECYCLE]] == ["r0", "r1"]
