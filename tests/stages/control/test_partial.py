"""Active partial rollouts (APRIL): which sequences the hook stops, on hand-built flights;
the loop's picture of a generate call; groups held whole; pipeline checks."""

from __future__ import annotations

import pyarrow as pa
import pytest

from gfcr.core.engine import Flight, Inflight
from gfcr.core.pipeline import PipelineError
from gfcr.core.rollout import col
from gfcr.runner.inprocess import SegmentHooks
from gfcr.runner.rounds import plan_defaults
from stages import (ActivePartialRollouts, GroupSample, OnlinePrune, RecyclePartials,
                    TokenBudget, UniformSampler, Verify)
from stages.generate.rows import hold_unfinished_groups
from tests.conftest import tiny_pipeline
from tests.resources.rollouts import context


def _view(key, tokens=4):
    return Inflight(key=key, completion_ids=[7] * tokens, logprobs=[-1.0] * tokens,
                    new_tokens=tokens)


def _flight_ctx(groups, ended=None):
    ctx = context()
    ctx.flight = Flight(groups=groups, ended=dict(ended or {}))
    return ctx


GROUPS = {0: "a", 1: "a", 2: "b", 3: "b", 4: "c", 5: "c"}


def test_flight_tracks_finished_stopped_and_complete_groups():
    f = Flight(groups=dict(GROUPS))
    f.observe([_view(1), _view(2), _view(3), _view(5)])  # 0 and 4 finished
    assert f.ended == {0: "finished", 4: "finished"} and f.complete_groups() == set()
    f.decided({5: "prune", 3: "stop"}, [_view(1), _view(2), _view(3), _view(5)])
    f.observe([_view(1, 6), _view(2, 6)])
    assert f.complete_groups() == {"c"}  # c: one finished, one pruned; b holds a stop
    f.observe([])
    assert f.complete_groups() == {"a", "c"} and f.spent() == 6 + 6 + 4 + 4
    f.observe([_view(0)])  # a key taken as finished comes back: several waves
    assert f.split


def test_april_stops_every_sequence_in_flight_once_the_target_is_complete():
    april = ActivePartialRollouts(over_provision=1.5)  # 3 groups -> target 2
    assert [april.target(g) for g in (1, 2, 3, 8, 12)] == [1, 2, 2, 6, 8]
    flying = [_view(1), _view(3), _view(5)]
    ctx = _flight_ctx(GROUPS, {0: "finished"})
    assert april.on_segment(ctx, flying) == {}  # nothing complete yet
    ctx = _flight_ctx(GROUPS, {0: "finished", 1: "finished", 2: "finished"})
    assert april.on_segment(ctx, [_view(3), _view(4), _view(5)]) == {}  # only a
    ctx = _flight_ctx(GROUPS, {0: "finished", 1: "finished", 4: "finished", 5: "prune"})
    assert april.on_segment(ctx, [_view(2), _view(3)]) == {2: "stop", 3: "stop"}


def test_april_refuses_without_groups_or_with_several_waves():
    april = ActivePartialRollouts()
    with pytest.raises(ValueError, match="'april'.*declared no request groups"):
        april.on_segment(context(), [_view(0)])
    ctx = _flight_ctx(GROUPS)
    ctx.flight.split = True
    with pytest.raises(ValueError, match="several waves.*max_batch"):
        april.on_segment(ctx, [_view(0)])


def test_segment_hooks_merge_decisions_prune_wins_and_keep_the_picture():
    class Stop:
        def on_segment(self, ctx, inflight):
            return {v.key: "stop" for v in inflight}

    class PruneOne:
        def on_segment(self, ctx, inflight):
            assert ctx.flight.groups == {0: "a", 1: "a"}
            return {1: "prune"}

    hooks = SegmentHooks(context(), [Stop(), PruneOne()])
    hooks.expect({0: "a", 1: "a"})
    assert hooks([_view(0), _view(1)]) == {0: "stop", 1: "prune"}
    assert hooks.flight.ended == {0: "stop", 1: "prune"}


def test_a_group_with_a_stopped_sample_is_held_whole():
    rows = [{col.GROUP_ID: g, col.STATUS: s} for g, s in
            [("a", "complete"), ("a", "partial"), ("a", "pruned"), ("b", "complete"),
             ("b", "pruned")]]
    assert [r[col.STATUS] for r in hold_unfinished_groups(rows)] == [
        "partial", "partial", "pruned", "complete", "pruned"]


def test_allocate_sees_the_generate_stage_defaults():
    plan = pa.table({col.PROMPT: ["P:", "Q:"], "n": pa.array([3, None], pa.int64())})
    plan = plan_defaults(plan, GroupSample(n=5, max_tokens=9))
    assert plan.column("n").to_pylist() == [3, 5]
    assert plan.column("max_tokens").to_pylist() == [9, 9]


def _stages(*control):
    return [RecyclePartials(), UniformSampler(batch=6), *control,
            GroupSample(n=4, max_tokens=8), Verify()]


def test_two_owners_of_the_stop_decision_are_rejected_naming_both_and_why():
    with pytest.raises(PipelineError) as err:
        tiny_pipeline(stages=_stages(ActivePartialRollouts(), TokenBudget(abort="stop")))
    (problem,) = err.value.problems
    assert "'april' and 'token_budget' both own the 'stop' decision" in problem
    assert "kept as partial rollouts" in problem and "only one stage may take it" in problem
    tiny_pipeline(stages=_stages(ActivePartialRollouts(), TokenBudget(abort="prune"),
                                 OnlinePrune()))  # prune is no stop: fine together


def test_april_without_recycling_is_rejected():
    with pytest.raises(PipelineError, match="'april' reads column 'recycle'"):
        tiny_pipeline(stages=[UniformSampler(batch=6), ActivePartialRollouts(),
                              GroupSample(n=4), Verify()])
