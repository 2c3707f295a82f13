"""LakeHistory: golden pass rates and posteriors, unseen prompts, lineage chains, time travel."""

from __future__ import annotations

import pytest

from gfcr.core.rollout import prompt_id
from store import StoreError
from store.history import GROUP_STATS_SCHEMA, PROMPT_STATS_SCHEMA, LakeHistory

from .conftest import QA, QB, commit_history, make_rollouts

W = 0.5 ** (1 / 8)  # weight of a step one step older than the latest, half-life 8


def test_prompt_stats_golden_and_prior_for_unseen(store):
    commit_history(store)
    stats = LakeHistory(store, run_id="r").prompt_stats()
    assert stats.schema == PROMPT_STATS_SCHEMA
    rows = {r["prompt_id"]: r for r in stats.to_pylist()}
    assert (rows[QA]["attempts"], rows[QA]["successes"]) == (5, 4)
    assert rows[QA]["ew_pass_rate"] == pytest.approx((1 + 3 * W) / (1 + 4 * W))
    unseen = prompt_id("add", "never")
    picked = LakeHistory(store).prompt_stats([QB, unseen, QA]).to_pylist()
    assert [r["prompt_id"] for r in picked] == [QB, unseen, QA]
    assert picked[0]["posterior_mean"] == pytest.approx(2 / 7)
    assert picked[1] == {"prompt_id": unseen, "task": None, "attempts": 0, "successes": 0, "last_step": None,
                         "posterior_mean": 0.5, "posterior_var": pytest.approx(1 / 12), "ew_pass_rate": None}
    assert picked[2]["posterior_var"] == pytest.approx(10 / 392)


def test_half_life_changes_only_the_ew_rate(store):
    commit_history(store)
    fast = LakeHistory(store, run_id="r", half_life=1.0).prompt_stats([QA]).to_pylist()[0]
    assert fast["ew_pass_rate"] == pytest.approx((1 + 3 * 0.5) / (1 + 4 * 0.5))
    assert fast["posterior_mean"] == pytest.approx(5 / 7)
    with pytest.raises(ValueError, match="half_life must be > 0"):
        LakeHistory(store, half_life=0).prompt_stats()


def test_group_stats_by_step_and_prompt(store):
    commit_history(store)
    groups = LakeHistory(store, run_id="r").group_stats(step=1, prompt_ids=[QA])
    assert groups.schema == GROUP_STATS_SCHEMA
    assert groups.to_pylist() == [{"run_id": "r", "step": 1, "group_id": "gA1", "prompt_id": QA, "size": 3,
                                   "n_kept": 3, "pass_rate": 1.0, "reward_mean": 1.0, "reward_std": 0.0}]
    assert LakeHistory(store).group_stats().num_rows == 4


def test_step_metrics_and_lineage_chain(store):
    commit_history(store)
    metrics = LakeHistory(store).step_metrics("r").to_pylist()
    assert [(m["step"], dict(m["metrics"])) for m in metrics] == [(0, {"loss": 1.0}), (1, {"loss": 0.5, "kl": 0.01})]
    chain = LakeHistory(store).lineage("r/1/2").to_pylist()
    assert [(c["depth"], c["rollout_id"], c["replay_count"]) for c in chain] == [(0, "r/1/2", 1), (1, "r/0/0", 0)]
    assert LakeHistory(store).lineage("missing").num_rows == 0


def test_time_travel_sees_the_history_as_it_was(store):
    commit_history(store)
    before = LakeHistory(store, run_id="r", as_of_step=1).prompt_stats()
    at_step0 = {r["prompt_id"]: r for r in LakeHistory(store, run_id="r", as_of_step=0).prompt_stats().to_pylist()}
    assert (at_step0[QA]["attempts"], at_step0[QA]["successes"], at_step0[QA]["last_step"]) == (4, 3, 0)
    # Later commits, of this run and of another, do not change what "as of step 1" reads...
    store.commit_step("r", 2, make_rollouts(8, run_id="r", step=2, prompt_id=[QA] * 8), policy_version=2, metrics={})
    store.commit_step("other", 0, make_rollouts(8, run_id="other", prompt_id=[QA] * 8), policy_version=0, metrics={})
    assert LakeHistory(store, run_id="r", as_of_step=1).prompt_stats().equals(before)
    snapshot = store.step_snapshot("r", 1)
    assert LakeHistory(store, as_of_snapshot=snapshot).prompt_stats().equals(before)  # only run r existed then
    # ...while the live history does change.
    live = {r["prompt_id"]: r for r in LakeHistory(store, run_id="r").prompt_stats().to_pylist()}
    assert live[QA]["attempts"] == 5 + 8
    assert LakeHistory(store, run_id="r", as_of_step=1).step_metrics().num_rows == 2


def test_as_of_errors(store):
    commit_history(store)
    with pytest.raises(StoreError, match="step 7 of run 'r' is not committed"):
        LakeHistory(store, run_id="r", as_of_step=7)
    with pytest.raises(ValueError, match="needs run_id"):
        LakeHistory(store, as_of_step=0)
    with pytest.raises(ValueError, match="not both"):
        LakeHistory(store, run_id="r", as_of_step=0, as_of_snapshot=1)
