"""Rollout Replay on a hand-built history: which groups are replayed, what a replayed row
carries (lineage, behaviour logprobs, policy versions), the replay bound, the metrics."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from gfcr.core.rollout import col
from gfcr.runner.metrics import rollout_metrics
from stages import RolloutReplay
from store import LakeHistory
from tests.resources.replay import Pool, attempts, commit, context

MIX = [1.0, 0.0, 1.0, 0.0]
FLAT = [0.0] * 4


def _trained(step: int, outcomes: dict, *, dropped: tuple[str, ...] = ()) -> pa.Table:
    """A committed step as the loop leaves it: kept groups trained at that step."""
    t = attempts(step, outcomes, policy_version_start=[step] * sum(map(len, outcomes.values())))
    kept = [t.column(col.PROMPT)[i].as_py() not in dropped for i in range(t.num_rows)]
    t = t.set_column(t.schema.get_field_index(col.KEPT), col.KEPT, pa.array(kept))
    consumed = pa.array([step if k else None for k in kept], pa.int64())
    return t.set_column(t.schema.get_field_index(col.CONSUMED_AT_STEP), col.CONSUMED_AT_STEP, consumed)


def _history(store):
    commit(store, [_trained(0, {"a0": MIX, "b0": MIX}), _trained(1, {"a1": MIX, "b1": MIX}),
                   _trained(2, {"a2": MIX, "b2": MIX}),
                   _trained(3, {"a3": MIX, "b3": FLAT}, dropped=("b3",))])


def _fresh(step: int) -> pa.Table:
    """This step's filtered batch: one group with signal, one flat group dropped."""
    return _trained(step, {f"new{step}": MIX, f"flat{step}": FLAT}, dropped=(f"flat{step}",))


def test_replays_the_newest_kept_groups_inside_the_window(store):
    _history(store)
    ctx = context(store, Pool([]), 4)
    stage = RolloutReplay(groups=4, max_share=0.5, window=2, max_replays=1)
    out = stage.augment(ctx, _fresh(4))
    replayed = out.filter(pc.greater(out.column(col.REPLAY_COUNT), 0))
    prompts = sorted(set(replayed.column(col.PROMPT).to_pylist()))
    # shortfall min(4 - 1, 0.5 * 4) = 2 groups: step 3's only kept group, then one of step 2
    assert len(prompts) == 2 and "a3" in prompts and set(prompts) - {"a3"} <= {"a2", "b2"}
    assert out.num_rows == 8 + 8
    assert set(replayed.column(col.PARENT_ID).to_pylist()) == {
        f"r/{p[-1]}/{p}/{i}" for p in prompts for i in range(4)}

def test_replayed_rows_keep_behaviour_policy_and_get_new_ids(store):
    _history(store)
    out = RolloutReplay(groups=4, window=2, max_replays=1).augment(context(store, Pool([]), 4), _fresh(4))
    replayed = out.filter(pc.greater(out.column(col.REPLAY_COUNT), 0)).to_pylist()
    originals = {r[col.ROLLOUT_ID]: r for r in store.sql("SELECT * FROM rollouts").to_pylist()}
    for row in replayed:
        src = originals[row[col.PARENT_ID]]
        for name in (col.LOGPROBS, col.COMPLETION_IDS, col.PROMPT_IDS, col.POLICY_VERSION_START,
                     col.POLICY_VERSION_END, col.REWARD, col.PROMPT_ID):
            assert row[name] == pytest.approx(src[name]) if name == col.LOGPROBS else row[name] == src[name]
        assert row[col.REPLAY_COUNT] == 1 and row[col.STEP] == 4 and row[col.KEPT]
        assert row[col.ROLLOUT_ID] not in originals and row[col.GROUP_ID] != src[col.GROUP_ID]
        assert row[col.ADVANTAGE] is None and row[col.CONSUMED_AT_STEP] is None
        assert row[col.GEN_SECONDS] == 0.0
    assert len({r[col.ROLLOUT_ID] for r in replayed}) == len(replayed)


def test_max_replays_and_lineage_through_the_store(store):
    _history(store)
    stage = RolloutReplay(groups=4, window=2, max_replays=1)
    step4 = stage.augment(context(store, Pool([]), 4), _fresh(4))
    trained = pc.if_else(step4.column(col.KEPT), 4, pa.scalar(None, pa.int64()))
    step4 = step4.set_column(step4.schema.get_field_index(col.CONSUMED_AT_STEP), col.CONSUMED_AT_STEP, trained)
    store.commit_step("r", 4, step4, policy_version=4, metrics={})
    first = set(step4.filter(pc.greater(step4.column(col.REPLAY_COUNT), 0)).column(col.PARENT_ID).to_pylist())
    step5 = stage.augment(context(store, Pool([]), 5), _fresh(5))
    again = step5.filter(pc.greater(step5.column(col.REPLAY_COUNT), 0))
    # window 2 at step 5: steps 3 and 4; a3 was replayed once already, replayed rows are
    # never candidates themselves: only step 4's new group is left
    assert set(again.column(col.PROMPT).to_pylist()) == {"new4"}
    assert not first & set(again.column(col.PARENT_ID).to_pylist())
    child = step4.filter(pc.equal(step4.column(col.PROMPT), "a3")).column(col.ROLLOUT_ID)[0].as_py()
    chain = LakeHistory(store).lineage(child).to_pylist()
    assert [(c["depth"], c["replay_count"], c["step"]) for c in chain] == [(0, 1, 4), (1, 0, 3)]


def test_nothing_replayed_when_the_batch_is_full_or_history_is_empty(store):
    _history(store)
    full = RolloutReplay(groups=1).augment(context(store, Pool([]), 4), _fresh(4))
    assert full.num_rows == 8
    assert RolloutReplay().augment(context(store, Pool([]), 0), _fresh(0)).num_rows == 8


def test_replay_metrics_count_rows_share_and_staleness(store):
    _history(store)
    out = RolloutReplay(groups=4, window=2).augment(context(store, Pool([]), 4), _fresh(4))
    m = rollout_metrics(out)
    stale = sorted(4 - v for v in out.filter(pc.greater(out.column(col.REPLAY_COUNT), 0))
                   .column(col.POLICY_VERSION_START).to_pylist())
    assert m["replay/rows"] == 8 and m["replay/tokens"] == 8 * 3
    assert m["replay/share"] == pytest.approx(8 / 12)  # 4 new kept rows + 8 replayed
    assert m["replay/staleness_mean"] == pytest.approx(sum(stale) / 8)
    assert m["replay/staleness_max"] == max(stale) == 2
    assert rollout_metrics(_fresh(4))["replay/rows"] == 0.0


def test_kept_groups_without_signal_are_not_replayed(store):
    commit(store, [_trained(0, {"flatkept": FLAT, "mix": MIX})])  # e.g. no dynamic sampling
    out = RolloutReplay(groups=4, window=2).augment(context(store, Pool([]), 1), _fresh(1))
    replayed = out.filter(pc.greater(out.column(col.REPLAY_COUNT), 0))
    assert set(replayed.column(col.PROMPT).to_pylist()) == {"mix"}
