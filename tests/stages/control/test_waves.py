"""Hooks that count groups over an engine call decoded in several waves: the HF engine
says which requests start in each wave, so a request of a later wave is pending, not
finished, and APRIL/ARRoL decide on exact counts."""

from __future__ import annotations

import pytest

from gfcr.core.engine import Flight, GenRequest, Inflight, SamplingParams
from gfcr.core.rollout import col
from gfcr.launch.run import execute
from gfcr.runner.inprocess import SegmentHooks
from stages import HF, ActivePartialRollouts, TinyLlama
from store import RolloutStore
from stages.replay.recycle import recycle_counts
from tests.resources.control import april_pipeline
from tests.resources.rollouts import context


def _view(key, tokens=2):
    return Inflight(key=key, completion_ids=[7] * tokens, logprobs=[-1.0] * tokens,
                    new_tokens=tokens)


def test_requests_not_started_are_pending_not_finished():
    f = Flight(groups={0: "a", 1: "a", 2: "b", 3: "b"})
    f.start([0, 1])
    f.observe([_view(1)])  # 0 finished; 2 and 3 wait for the next wave
    assert f.ended == {0: "finished"} and f.complete_groups() == set()
    f.observe([])
    f.start([2, 3])
    f.observe([_view(2), _view(3)])
    assert f.complete_groups() == {"a"} and not f.split
    f.observe([])
    assert f.complete_groups() == {"a", "b"}


def test_april_does_not_count_a_later_wave_as_complete():
    hooks = SegmentHooks(context(), [ActivePartialRollouts(over_provision=2.0)])  # 4 -> 2
    hooks.expect({k: "abcd"[k // 2] for k in range(8)})
    hooks.wave([0, 1, 2, 3])
    assert hooks([_view(2), _view(3)]) == {}  # a done; b, and c and d (not started) are not
    assert hooks([_view(3)]) == {}
    assert hooks([]) == {}  # a, b done: target met, nothing left in flight
    hooks.wave([4, 5, 6, 7])
    assert hooks([_view(k) for k in range(4, 8)]) == {k: "stop" for k in range(4, 8)}


def test_the_hf_engine_announces_each_wave_and_requests_that_end_at_once():
    policy = TinyLlama(hidden_size=32, num_layers=1, num_heads=2,
                       intermediate_size=64).build(seed=0)
    engine = HF(device="cpu", max_batch=2).build(policy, seed=0)
    waves = []

    class Hook:
        def wave(self, keys):
            waves.append(list(keys))

        def __call__(self, inflight):
            return {}

        def expect(self, groups):
            pass

    ids = engine.encode("1+1=")
    requests = [GenRequest(key=k, prompt_ids=ids) for k in range(5)]
    requests.append(GenRequest(key=9, prompt_ids=ids, prefix_ids=ids, prefix_logprobs=[0.0] * 4,
                               max_tokens=4))  # no room left: ends at once, never decoded
    engine.generate(requests, SamplingParams(max_tokens=3, seed=0), Hook())
    assert waves == [[0, 1, 9], [2, 3], [4]]


def test_april_runs_over_several_engine_waves_and_continues_what_it_stops(tmp_path):
    p = april_pipeline(steps=3)  # 6 groups of 4 a step: 3 waves of 8
    p = p.model_copy(update={"engine": HF(device="cpu", max_batch=8)})
    summary = execute(p, root=tmp_path, executor="local")
    with RolloutStore.open(tmp_path / "store", read_only=True) as s:
        rows = s.sql("SELECT * FROM rollouts WHERE run_id = $r", {"r": summary.run_id}).to_pylist()
        counts = recycle_counts(s, summary.run_id)
    assert counts["continued"] and counts["discarded"] == 0
    complete = {(r[col.STEP], r[col.GROUP_ID]) for r in rows if r[col.STATUS] == "complete"}
    for step in range(3):  # at least the target (4 of 6 groups) trains every step
        assert sum(s == step for s, _ in complete) >= 4
    continued = {r[col.PARENT_ID] for r in rows if r[col.PARENT_ID]}
    assert all(r[col.ROLLOUT_ID] in continued for r in rows
               if r[col.STATUS] == "partial" and r[col.STEP] < 2)


def test_without_wave_announcements_april_names_what_to_change():
    ctx = context()
    ctx.flight = Flight(groups={0: "a", 1: "a"}, split=True)
    with pytest.raises(ValueError) as err:
        ActivePartialRollouts().on_segment(ctx, [_view(0)])
    message = str(err.value)
    assert "'april'" in message and "2 requests" in message
    assert "max_batch to at least 2" in message and "batch" in message and "n)" in message
