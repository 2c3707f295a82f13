"""Online pruning (ARRoL): the balancing rule and the quality head on hand-built inputs,
which sequences the hook prunes, and a run through the real loop and store."""

from __future__ import annotations

import numpy as np
import pytest

from gfcr.core.engine import Flight, Inflight
from gfcr.core.rollout import col
from gfcr.launch.run import execute
from stages import GRPO, GroupSample, OnlinePrune, UniformSampler, Verify
from stages.control.prune import balance_prunes
from stages.control.quality import FEATURES, Head, examples, features, fit
from store import RolloutStore
from tests.conftest import tiny_pipeline
from tests.resources.digits import Digits
from tests.resources.rollouts import context


@pytest.mark.parametrize("p, budget, margin, pruned", [
    ([0.9, 0.95, 0.8, 0.1], 2, 0.25, [1, 0]),    # 3 likely right, 1 wrong: two right go
    ([0.1, 0.05, 0.2, 0.9], 5, 0.25, [1, 0]),    # mirror image, most confident first
    ([0.6, 0.7, 0.65, 0.2], 2, 0.25, []),        # the majority is not confident enough
    ([0.9, 0.9, 0.9, 0.9], 1, 0.25, [0]),        # the budget binds; ties: earlier first
    ([0.9, 0.1, 0.8, 0.2], 2, 0.0, []),          # balanced already
])
def test_balance_prunes(p, budget, margin, pruned):
    assert balance_prunes(p, budget, margin) == pruned


def test_quality_head_learns_which_prefixes_succeed():
    rng = np.random.default_rng(0)
    good = [list(rng.normal(-0.2, 0.05, 12)) for _ in range(40)]
    bad = [list(rng.normal(-2.5, 0.5, 12)) for _ in range(40)]
    x, y = examples(good + bad, [1.0] * 40 + [0.0] * 40, stride=4)
    assert x.shape == (80 * 2, len(FEATURES))  # cuts at 4 and 8, never the whole rollout
    head = fit(x, y)
    p = head.predict(np.vstack([features(good[0][:6]), features(bad[0][:6])]))
    assert p[0] > 0.9 and p[1] < 0.1


def _view(key, mean_lp, tokens=8):
    return Inflight(key=key, completion_ids=[5] * tokens, logprobs=[mean_lp] * tokens,
                    new_tokens=tokens)


def test_the_hook_prunes_the_majority_side_within_budget(monkeypatch):
    # p = sigmoid(5 + 5 * mean logprob): about 0.98 at -0.2, 0.007 at -2
    weights = np.zeros(len(FEATURES) + 1)
    weights[0], weights[1 + FEATURES.index("mean_logprob")] = 5.0, 5.0
    head = Head(mean=np.zeros(len(FEATURES)), scale=np.ones(len(FEATURES)), weights=weights,
                examples=100)
    monkeypatch.setattr(OnlinePrune, "head", lambda self, ctx: head)
    groups = {k: "abc"[k // 4] for k in range(12)}
    ctx = context()
    ctx.flight = Flight(groups=groups, ended={4: "finished", 8: "prune"})
    flying = [_view(0, -0.2), _view(1, -0.2), _view(2, -0.2), _view(3, -2.0),
              _view(5, -2.0, tokens=2), _view(6, -2.0), _view(7, -2.0),
              _view(9, -0.2), _view(10, -0.2), _view(11, -0.2)]
    decisions = OnlinePrune(min_tokens=4, max_prune=0.5).on_segment(ctx, flying)
    # a: 3 right vs 1 wrong -> two right go; b: 5 is too short to judge, 6 and 7 go and
    # 4 (finished) and 5 survive; c: one already pruned, so one more at most
    assert decisions == {0: "prune", 1: "prune", 6: "prune", 7: "prune", 9: "prune"}


def test_no_head_no_pruning_without_history():
    assert OnlinePrune().head(context()) is None
    assert OnlinePrune().on_segment(context(), [_view(0, -1.0)]) == {}


def test_online_pruning_through_the_loop(tmp_path):
    prune = OnlinePrune(min_tokens=4, margin=0.0, window=2, min_examples=8)
    p = tiny_pipeline(task=Digits(), steps=3, stages=[
        UniformSampler(batch=4), prune, GroupSample(n=4, max_tokens=16, segment_tokens=4),
        Verify(), GRPO(lr=1e-3)])
    summary = execute(p, root=tmp_path, executor="local")
    with RolloutStore.open(tmp_path / "store", read_only=True) as s:
        rows = s.sql("SELECT * FROM rollouts WHERE run_id = $r",
                     {"r": summary.run_id}).to_pylist()
    pruned = [r for r in rows if r[col.STATUS] == "pruned"]
    assert pruned and all(r[col.STEP] > 0 for r in pruned)  # step 0: no history, no head
    for r in pruned:
        assert (r[col.FINISH_REASON], r[col.KEPT], r[col.DROP_REASON]) == (
            "pruned", False, "pruned")
        assert r[col.REWARD] is None and r[col.N_TOKENS] < 16
    for group in {r[col.GROUP_ID] for r in rows}:
        survivors = [r for r in rows if r[col.GROUP_ID] == group and r[col.STATUS] != "pruned"]
        assert len(survivors) >= 2
    for m, step in zip(summary.history, range(3)):
        here = [r for r in rows if r[col.STEP] == step]
        assert m["pruned_frac"] == pytest.approx(
            sum(r[col.STATUS] == "pruned" for r in here) / len(here))
