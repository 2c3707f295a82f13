"""Per-prompt allocation under a fixed budget (XRPO, GDRO square-root rule, DARS): exact
totals, bounds, known answers on hand-built histories, and a run through the loop."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from gfcr.core.rollout import col
from gfcr.launch.run import execute
from stages import GroupSample, RecyclePartials, RolloutAllocator, UniformSampler, Verify
from stages.control.allocate import apportion, greedy_variance
from stages.generate.rows import RECYCLE, RECYCLE_TYPE
from store import RolloutStore
from tests.conftest import tiny_pipeline
from tests.resources.rollouts import context


class History:
    """A hand-built prompt history: Beta(1 + s, 1 + f) per prompt id, the prior if unseen."""

    def __init__(self, counts: dict[str, tuple[int, int]]):
        self.counts = counts

    def prompt_stats(self, ids):
        s = np.array([self.counts.get(i, (0, 0))[0] for i in ids], dtype=float)
        n = np.array([sum(self.counts.get(i, (0, 0))) for i in ids], dtype=float)
        return pa.table({"prompt_id": ids, "attempts": n.astype(np.int64),
                         "posterior_mean": (1 + s) / (2 + n)})


def _plan(*ids, recycled=()):
    rec = [[{"sample_idx": 0, "parent_id": "x", "prefix_ids": [], "prefix_logprobs": [],
             "policy_version_start": None, "policy_version_end": None,
             "finish_reason": None}] * 3 if i in recycled else None for i in ids]
    return pa.table({col.PROMPT_ID: list(ids), "n": pa.array([3 if i in recycled else 8
                                                               for i in ids], pa.int64()),
                     RECYCLE: pa.array(rec, RECYCLE_TYPE)})


def test_apportion_is_exact_bounded_and_proportional():
    assert apportion(np.array([1.0, 1.0, 2.0]), 8, 1, 8).tolist() == [2, 2, 4]
    assert apportion(np.array([1.0, 100.0, 1.0]), 12, 2, 6).tolist() == [3, 6, 3]
    assert apportion(np.zeros(3), 7, 2, 8).tolist() == [3, 2, 2]  # no signal: even split
    rng = np.random.default_rng(0)
    for _ in range(50):
        w = rng.exponential(size=int(rng.integers(1, 12)))
        lo, total = int(rng.integers(1, 4)), None
        total = int(rng.integers(lo * len(w), 9 * len(w) + 1))
        n = apportion(w, total, lo, 9)
        assert n.sum() == total and n.min() >= lo and n.max() <= 9
    with pytest.raises(ValueError, match="cannot split 3"):
        apportion(np.ones(2), 3, 2, 8)


def test_uncertainty_rule_feeds_the_least_known_prompts():
    # unseen (variance of the prior) vs. tried 40 times at 0.9: the unseen ones get more
    mean, attempts = np.array([0.5, 0.9, 0.5]), np.array([0.0, 40.0, 0.0])
    assert greedy_variance(mean, attempts, 12, 2, 8).tolist() == [5, 2, 5]


def test_rules_on_a_hand_built_history():
    history = History({"easy": (19, 1), "mid": (5, 5), "hard": (1, 19)})
    ctx = context(history=history)
    plan = _plan("easy", "mid", "hard", "new")

    def n(rule):
        return RolloutAllocator(budget=24, rule=rule, min_n=2, max_n=16).allocate(
            ctx, plan).column("n").to_pylist()
    # means 20/22, 1/2, 2/22, 1/2. sqrt(m(1-m)) = .29, .5, .29, .5 -> 4.4, 7.6, 4.4, 7.6
    assert n("sqrt") == [4, 8, 4, 8]
    # 1/m = 1.1, 2, 11, 2: hard is capped at 16, easy floored at 2, 6 left for the others
    assert n("hard") == [2, 3, 16, 3]
    easy, mid, hard, new = n("uncertainty")  # unseen > tried at 1/2 > tried at the edges
    assert new > mid > easy == hard
    assert all(sum(n(r)) == 24 for r in ("sqrt", "hard", "uncertainty"))


def test_recycled_groups_keep_their_size_and_are_not_counted():
    plan = _plan("a", "r", "b", recycled={"r"})
    out = RolloutAllocator(budget=10, rule="sqrt").allocate(context(), plan)
    assert out.column("n").to_pylist() == [5, 3, 5]


def test_an_impossible_budget_names_stage_field_and_values():
    with pytest.raises(ValueError, match=r"'rollout_allocator': budget=3 samples cannot be "
                                         r"split over 2 prompts with min_n=2"):
        RolloutAllocator(budget=3).allocate(context(), _plan("a", "b"))
    with pytest.raises(ValueError, match="min_n=5 must not exceed max_n=4"):
        RolloutAllocator(min_n=5, max_n=4)


def test_every_step_spends_exactly_the_budget(tmp_path):
    p = tiny_pipeline(steps=2, stages=[RecyclePartials(), UniformSampler(batch=4),
                                       RolloutAllocator(budget=13, rule="hard"),
                                       GroupSample(n=8, max_tokens=2), Verify()])
    summary = execute(p, root=tmp_path, executor="local")
    with RolloutStore.open(tmp_path / "store", read_only=True) as s:
        per_step = s.sql("SELECT step, count(*) AS n, count(DISTINCT group_id) AS g FROM "
                         "rollouts WHERE run_id = $r GROUP BY step ORDER BY step",
                         {"r": summary.run_id}).to_pylist()
    assert [(r["n"], r["g"]) for r in per_step] == [(13, 4), (13, 4)]
