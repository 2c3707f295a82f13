"""Prompt selectors on hand-built histories with known answers: InSight, VADE, DOTS,
Prompt-GDRO. Histories are committed to a temp store and read through History."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import integrate, stats

from stages import DOTS, VADE, InSight, PromptGDRO
from stages.replay import _beliefs
from tests.resources.replay import Pool, attempts, chosen_texts, commit, context, empty

MID = [1.0, 0.0] * 4


def _h(p):
    return -(p * np.log(p) + (1 - p) * np.log(1 - p))


# --------------------------------------------------------------------------- InSight


def test_insight_prefers_evidence_poor_moderate_prompts(store):
    """new (never tried) > fluke (1/1) > mid (4/8) > hard (0/8) ~ easy (8/8)."""
    pool = Pool(["easy", "hard", "mid", "fluke", "new"])
    commit(store, [attempts(0, {"easy": [1.0] * 8, "hard": [0.0] * 8, "mid": MID, "fluke": [1.0]})])
    ctx = context(store, pool, 1)
    picked = InSight(batch=3, rollouts=8).select(ctx, empty())
    assert chosen_texts(picked) == ["new", "fluke", "mid"]
    # an earlier select stage's choice counts towards the batch
    first = InSight(batch=1).select(ctx, empty())
    assert chosen_texts(InSight(batch=3).select(ctx, first)) == ["new", "fluke", "mid"]


def test_insight_scores_match_numerical_integration(store):
    pool = Pool(["easy", "hard", "mid", "fluke", "new"])
    commit(store, [attempts(0, {"easy": [1.0] * 8, "hard": [0.0] * 8, "mid": MID, "fluke": [1.0]})])
    ctx = context(store, pool, 1)
    ids = pool.table.column("prompt_id").to_pylist()
    got = InSight(rollouts=8).scores(ctx, ids)
    p0 = 14 / 27  # (1 + 13 successes) / (2 + 25 attempts)
    for score, (n, s) in zip(got, [(8, 8), (8, 0), (8, 4), (1, 1), (0, 0)]):
        a, b = 2 * p0 + s, 2 * (1 - p0) + n - s
        mu = a / (a + b)
        expected_h = integrate.quad(lambda t: _h(t) * stats.beta.pdf(t, a, b), 0, 1)[0]
        assert score == pytest.approx((1 - mu ** 8 - (1 - mu) ** 8) * (_h(mu) - expected_h), rel=1e-6)


def test_digamma_matches_scipy():
    from scipy.special import digamma
    x = np.array([1e-3, 0.3, 1.0, 2.5, 5.999, 6.0, 40.0, 1e4])
    assert np.allclose(_beliefs.digamma(x), digamma(x), rtol=0, atol=1e-9)


# --------------------------------------------------------------------------- VADE


def test_vade_thompson_picks_the_prompt_with_signal(store):
    pool = Pool(["easy", "hard", "mid"])
    commit(store, [attempts(0, {"easy": [1.0] * 80, "hard": [0.0] * 80, "mid": MID * 10})])
    for seed in range(10):
        ctx = context(store, pool, 1, seed=seed)
        assert chosen_texts(VADE(batch=1, half_life=None).select(ctx, empty())) == ["mid"]


def test_vade_draws_are_seeded_by_step_and_stage(store):
    pool = Pool([f"q{i}" for i in range(40)])
    commit(store, [attempts(0, {"q0": MID})])
    a = VADE(batch=5).select(context(store, pool, 1), empty())
    b = VADE(batch=5).select(context(store, pool, 1), empty())
    c = VADE(batch=5, name="other").select(context(store, pool, 1), empty())
    assert chosen_texts(a) == chosen_texts(b) != chosen_texts(c)


def test_vade_two_scale_prior_decay(store):
    """Old evidence fades per prompt (half_life); the prior mean follows the recent pass
    rate on the faster scale (prior_half_life)."""
    pool = Pool(["old", "recent"])
    steps = [attempts(0, {"old": [0.0] * 80})]
    steps += [attempts(t, {"recent": [0.0]}) for t in range(1, 39)]
    steps += [attempts(39, {"recent": [1.0] * 8})]
    commit(store, steps)
    ctx = context(store, pool, 40)
    b = _beliefs.beliefs(ctx, pool.table.column("prompt_id").to_pylist(), strength=2.0,
                         half_life=2.0, prior_half_life=1.0)
    assert b.n[0] == pytest.approx(80 * 0.5 ** 20)  # 40 steps old, half-life 2
    weights = 0.5 ** ((40 - np.arange(1, 39)) / 1.0)
    n, s = 0.5 * 8 + weights.sum() + 80 * 0.5 ** 40, 0.5 * 8
    assert b.prior_mean == pytest.approx((1 + s) / (2 + n))
    assert b.mean[0] == pytest.approx(b.prior_mean, abs=1e-3)  # "old" is back to the prior


# --------------------------------------------------------------------------- DOTS


def test_dots_predicts_unseen_prompts_from_similar_attempted_ones(store):
    pool = Pool(["1 + 1 =", "98 - 76 =", "1 + 2 =", "97 - 75 =", "99 - 77 ="])
    commit(store, [attempts(0, {"1 + 1 =": MID, "98 - 76 =": [0.0] * 8})])
    ctx = context(store, pool, 1)
    stage = DOTS(batch=1, temperature=0.05, half_life=None)
    assert chosen_texts(stage.select(ctx, empty())) == ["1 + 2 ="]
    evidence = _reads_evidence(ctx, stage)
    p0 = 5 / 18
    predicted = stage.predict(pool.table, pool.table, evidence)
    moderate, hard = (4 + 2 * p0) / 10, (0 + 2 * p0) / 10
    assert predicted[2] == pytest.approx(moderate, abs=0.02)  # nearly all attention on "1 + 1"
    assert hard < predicted[3] < 0.1 and hard < predicted[4] < 0.1  # mostly on "98 - 76"
    # an attempted prompt's own evidence updates its similarity prior (strength 2)
    assert predicted[0] == pytest.approx((4 + 2 * hard) / 10)  # its only other reference: hard


def test_dots_without_history_draws_at_random_but_reproducibly():
    from gfcr.core.stage import StepContext

    pool = Pool([f"{i} + {i} =" for i in range(30)])
    ctx = StepContext(run_id="r", step=0, seed=3, policy_version=0, task=pool)
    a = DOTS(batch=4, candidates=10).select(ctx, empty())
    assert a.num_rows == 4 and chosen_texts(a) == chosen_texts(DOTS(batch=4, candidates=10).select(
        StepContext(run_id="r", step=0, seed=3, policy_version=0, task=pool), empty()))


def test_a_pick_does_not_depend_on_the_last_bits_of_its_scores():
    """Scores that differ only by rounding (another CPU's SIMD kernels: the dots_rr goldens
    drew other prompts on another machine) are ties, broken by the seeded rng alone."""
    pool = Pool([f"{i} + {i} =" for i in range(40)])
    scores = np.repeat([0.25, 0.5, 0.75, 1.0], 10)
    noisy = scores + np.random.default_rng(7).uniform(-1e-12, 1e-12, scores.size)

    def draw(s):
        return chosen_texts(_beliefs.pick(empty(), pool.table, s, 15, np.random.default_rng(1)))

    assert draw(noisy) == draw(scores)
    assert set(draw(scores)[:10]) == {f"{i} + {i} =" for i in range(30, 40)}  # the best first
    # a real difference (1e-6) is never a tie
    lifted = scores.copy()
    lifted[20] += 1e-6
    assert draw(scores)[10] != "20 + 20 =" and draw(lifted)[10] == "20 + 20 ="


def _reads_evidence(ctx, stage):
    from stages.replay import _reads

    return _reads.prompt_evidence(ctx.history, now=ctx.step, half_life=stage.half_life)


# --------------------------------------------------------------------------- Prompt-GDRO


def test_gdro_weights_are_multiplicative_in_the_debiased_group_loss(store):
    pool = Pool(["hard1", "hard2", "easy1", "easy2"])
    commit(store, [attempts(t, {"hard1": [0.0] * 4, "hard2": [0.0] * 4, "easy1": [1.0] * 4,
                                "easy2": [1.0] * 4}) for t in range(3)])
    ctx = context(store, pool, 3)
    stage = PromptGDRO(bins=2, eta=0.1)
    ids = pool.table.column("prompt_id").to_pylist()
    groups = stage.groups(ctx, ids)
    assert groups.tolist() == [0, 0, 1, 1]
    w = stage.weights(ctx, dict(zip(ids, groups.tolist())))
    assert w[1] / w[0] == pytest.approx(np.exp(-0.1 * 3))  # debiased EMA of a constant 1 is 1
    picked = PromptGDRO(bins=2, eta=10.0, gamma=0.0, batch=2).select(ctx, empty())
    assert sorted(chosen_texts(picked)) == ["hard1", "hard2"]


def test_gdro_exploration_reaches_every_group(store):
    pool = Pool(["hard1", "hard2", "easy1", "easy2"])
    commit(store, [attempts(t, {"hard1": [0.0] * 4, "easy1": [1.0] * 4}) for t in range(3)])
    seen = set()
    for seed in range(20):
        ctx = context(store, pool, 3, seed=seed)
        seen |= set(chosen_texts(PromptGDRO(bins=2, eta=10.0, gamma=1.0, batch=1).select(ctx, empty())))
    assert {"easy1", "easy2"} & seen and {"hard1", "hard2"} & seen
