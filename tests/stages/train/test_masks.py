"""Loss masks in the learner: forced hint tokens (ADHint), as a column or as a
forced-prefix turn, and D³S's token share; D³S's whole-group advantages."""

import math

import numpy as np
import pytest
import torch

from stages.train.selection import token_mask
from stages.train.advantages import lookup_advantage
from stages.train.batching import padded
from stages.train.forward import sequence_logprobs, sequence_logprobs_entropy
from stages.train.grpo import GRPO
from stages.train.loss import policy_loss, token_entropy
from stages.train.masks import d3s_masks
from tests.stages.train.conftest import TINY, grads, rollouts

REWARDS = [1.0, 0.0, 0.2, 0.7, 1.0, 0.0]
GROUPS = ["a", "a", "b", "b", "c", "c"]
LONG = ["123", "9", "12", "14", "77", "5"]  # + EOS: 4, 2, 3, 3, 3, 2 tokens
HINTS = [2, 0, 1, 0, 3, 0]


def _reference_gradient(policy, batch, loss_mask_of, aggregation="seq_mean"):
    """The gradient of GRPO's loss written out by hand with ``loss_mask_of(mask)``."""
    model = policy.model
    model.zero_grad(set_to_none=True)
    prompts = batch.column("prompt_ids").to_pylist()
    completions = batch.column("completion_ids").to_pylist()
    adv = lookup_advantage("grpo")(np.array(REWARDS), np.array(GROUPS))
    new, mask = sequence_logprobs(model, prompts, completions, 1.0,
                                  policy.tokenizer.pad_token_id)
    old = padded(batch.column("logprobs").to_pylist(), mask.shape[1])
    loss, _ = policy_loss(new, old, torch.tensor(adv, dtype=torch.float32),
                          loss_mask_of(mask.clone()), clip_low=0.2, clip_high=0.28,
                          aggregation=aggregation)
    loss.backward()
    return loss.item(), grads(model)


def _without_hints(mask):
    for i, h in enumerate(HINTS):
        mask[i, :h] = False
    return mask


@pytest.mark.parametrize("aggregation", ["seq_mean", "token_mean"])
def test_hinted_tokens_give_the_gradient_of_the_loss_without_them(aggregation):
    policy = TINY.build(seed=0)
    batch = rollouts(policy, REWARDS, GROUPS, completions=LONG, hint_tokens=HINTS)
    learner = GRPO(aggregation=aggregation).learner(policy, seed=0)
    loss = learner.loss_and_gradients(None, batch)
    got = grads(policy.model)
    want_loss, want = _reference_gradient(policy, batch, _without_hints, aggregation)
    assert loss == pytest.approx(want_loss, rel=1e-6)
    for a, b in zip(got, want):
        assert torch.allclose(a, b, rtol=1e-6, atol=1e-8)
    # and it is not the gradient with the hint tokens in the loss
    _, unmasked = _reference_gradient(policy, batch, lambda m: m, aggregation)
    assert any(not torch.allclose(a, b) for a, b in zip(got, unmasked))


def test_hinted_tokens_logprobs_do_not_enter_the_ratio():
    policy = TINY.build(seed=0)
    shift = [[5.0] * h + [0.0] * 8 for h in HINTS]  # wildly off logprobs on forced tokens
    plain = rollouts(policy, REWARDS, GROUPS, completions=LONG, hint_tokens=HINTS)
    shifted = rollouts(policy, REWARDS, GROUPS, completions=LONG, hint_tokens=HINTS,
                       shift=shift)
    learner = GRPO().learner(policy, seed=0)
    learner.loss_and_gradients(None, plain)
    first = grads(policy.model)
    learner.loss_and_gradients(None, shifted)
    for a, b in zip(first, grads(policy.model)):
        assert torch.equal(a, b)


def test_a_fully_hinted_row_is_not_trained_and_too_many_hints_raise():
    policy = TINY.build(seed=0)
    learner = GRPO().learner(policy, seed=0)
    result = learner.update(None, rollouts(policy, REWARDS[:4], GROUPS[:4], completions=LONG,
                                           hint_tokens=[4, 0, 0, 0]))
    assert result.metrics["n_seqs"] == 3
    with pytest.raises(ValueError, match=r"grpo: batch row 0 has hint_tokens=5 but 4 "):
        learner.update(None, rollouts(policy, REWARDS[:4], GROUPS[:4], completions=LONG,
                                      hint_tokens=[5, 0, 0, 0]))


def test_a_forced_prefix_turn_trains_as_hint_tokens_do():
    """The hint as a forced-prefix turn (gfcr.core.trajectory.TURN_TYPE), with no hint_tokens
    column, gives the learner the gradient the hint_tokens column gives."""
    from gfcr.core.rollout import with_turns

    policy = TINY.build(seed=0)
    hinted = rollouts(policy, REWARDS, GROUPS, completions=LONG, hint_tokens=HINTS)
    as_turns = with_turns(hinted).drop_columns(["hint_tokens"])
    assert [t["source"] for t in as_turns.column("turns")[0].as_py()] == [
        "environment", "forced", "policy"]
    learner = GRPO().learner(policy, seed=0)
    learner.loss_and_gradients(None, hinted)
    first = grads(policy.model)
    learner.loss_and_gradients(None, as_turns)
    for a, b in zip(first, grads(policy.model)):
        assert torch.equal(a, b)
    learner.loss_and_gradients(None, hinted.drop_columns(["hint_tokens"]))
    assert any(not torch.equal(a, b) for a, b in zip(first, grads(policy.model)))


def test_d3s_keeps_the_share_of_tokens_with_the_largest_advantage_times_entropy():
    policy = TINY.build(seed=0)
    batch = rollouts(policy, REWARDS, GROUPS, completions=LONG,
                     token_keep_ratio=[0.5] * len(REWARDS))
    learner = GRPO().learner(policy, seed=0)
    adv = lookup_advantage("grpo")(np.array(REWARDS), np.array(GROUPS))
    work = learner.prepare(None, batch, adv)
    total = sum(len(c) for c in batch.column("completion_ids").to_pylist())
    kept = sum(int(m.sum()) for m in work.masks)
    with torch.no_grad():
        _, _, h = sequence_logprobs_entropy(
            policy.model, batch.column("prompt_ids").to_pylist(),
            batch.column("completion_ids").to_pylist(), entropy=token_entropy)
    scores = [abs(a) * h[i, :len(m)].numpy() for i, (a, m) in enumerate(zip(adv, work.masks))]
    flat = np.sort(np.concatenate(scores))[::-1]
    threshold = flat[math.ceil(0.5 * total) - 1]
    # rows 0 and 4 share a prompt and |A|: their first tokens tie, and ties are kept
    assert kept == int((flat >= threshold - 1e-6).sum()) == math.ceil(0.5 * total) + 1
    kept_scores = np.concatenate([s[m] for s, m in zip(scores, work.masks)])
    dropped = np.concatenate([s[~m] for s, m in zip(scores, work.masks)])
    assert kept_scores.min() >= dropped.max() - 1e-6
    assert learner.update(None, batch).metrics["loss_token_share"] == pytest.approx(kept / total)


def test_d3s_ranks_only_tokens_already_in_the_loss():
    masks = [np.array([False, True, True]), np.array([True, True])]
    entropies = [np.array([9.0, 1.0, 2.0]), np.array([3.0, 0.5])]
    out = d3s_masks(masks, [1.0, 1.0], entropies, 0.5)  # 4 loss tokens -> keep 2
    assert [m.tolist() for m in out] == [[False, False, True], [True, False]]
    assert [m.tolist() for m in d3s_masks(masks, [1.0, 1.0], entropies, None)] == \
        [m.tolist() for m in masks]


def test_no_mask_columns_means_every_token_trains():
    policy = TINY.build(seed=0)
    batch = rollouts(policy, REWARDS, GROUPS, completions=LONG,
                     token_keep_ratio=[None] * len(REWARDS))
    work = GRPO().learner(policy, seed=0).prepare(
        None, batch, lookup_advantage("grpo")(np.array(REWARDS), np.array(GROUPS)))
    assert all(m.all() for m in work.masks)


D3S_ADV = [1.5, -0.5, 0.3, None, 2.0, -1.0]  # row 3: none, the estimator's value stands


def _d3s_expected():
    """D3S_ADV with the GRPO estimate (over the whole batch) where it is None."""
    recomputed = lookup_advantage("grpo")(np.array(REWARDS), np.array(GROUPS))
    return np.array([r if a is None else a for a, r in zip(D3S_ADV, recomputed)])


def _hand_gradient(policy, batch, adv, ratio=None, mask_adv=None):
    """GRPO's seq_mean loss with advantages ``adv`` written out by hand; with ``ratio``,
    only the tokens D³S's token_mask keeps under |mask_adv| x entropy (default: ``adv``)
    enter it."""
    model = policy.model
    model.zero_grad(set_to_none=True)
    prompts = batch.column("prompt_ids").to_pylist()
    completions = batch.column("completion_ids").to_pylist()
    new, mask, h = sequence_logprobs_entropy(model, prompts, completions,
                                             entropy=token_entropy)
    if ratio is not None:
        lengths = [len(c) for c in completions]
        kept = token_mask(list(adv if mask_adv is None else mask_adv), [h[i, :n].detach().numpy() for i, n in
                                      enumerate(lengths)], ratio)
        mask = padded(kept, mask.shape[1], dtype=torch.bool)
    old = padded(batch.column("logprobs").to_pylist(), mask.shape[1])
    loss, _ = policy_loss(new, old, torch.tensor(adv, dtype=torch.float32), mask,
                          clip_low=0.2, clip_high=0.28, aggregation="seq_mean")
    loss.backward()
    return loss.item(), grads(model)


@pytest.mark.parametrize("ratio", [None, 0.5])
def test_d3s_advantages_are_trained_on_as_they_are(ratio):
    policy = TINY.build(seed=0)
    batch = rollouts(policy, REWARDS, GROUPS, completions=LONG, d3s_advantage=D3S_ADV,
                     token_keep_ratio=[ratio] * len(REWARDS))
    learner = GRPO().learner(policy, seed=0)
    loss = learner.loss_and_gradients(None, batch)
    got = grads(policy.model)
    want_loss, want = _hand_gradient(policy, batch, _d3s_expected(), ratio)
    assert loss == pytest.approx(want_loss, rel=1e-6)
    # float32 noise only: the chunked output layer packs each pass's real tokens, so two
    # passes over different rows multiply matrices of other shapes (~1e-7 of a gradient ~1)
    for a, b in zip(got, want):
        assert torch.allclose(a, b, rtol=1e-6, atol=1e-6)
    # not the gradient of the advantages recomputed on the batch
    recomputed = lookup_advantage("grpo")(np.array(REWARDS), np.array(GROUPS))
    _, other = _hand_gradient(policy, batch, recomputed, ratio)
    assert any(not torch.allclose(a, b) for a, b in zip(got, other))
    if ratio is not None:  # and the token mask ranks by |d3s_advantage| too
        _, other_mask = _hand_gradient(policy, batch, _d3s_expected(), ratio, recomputed)
        assert any(not torch.allclose(a, b) for a, b in zip(got, other_mask))
    result = learner.update(None, batch)
    assert result.advantages == _d3s_expected().tolist()  # the stored advantage column


def test_a_non_finite_d3s_advantage_is_refused_naming_the_row():
    policy = TINY.build(seed=0)
    batch = rollouts(policy, REWARDS, GROUPS, completions=LONG,
                     d3s_advantage=[1.0, float("nan"), 0.0, 0.0, 0.0, 0.0])
    with pytest.raises(ValueError, match=r"grpo: batch row 1 has d3s_advantage=nan; it "
                                         r"must be finite, or null for none"):
        GRPO().learner(policy, seed=0).update(None, batch)


def test_for_batch_reads_masks_turn_credit_and_overrides_in_one_place():
    """stages.train.masks.for_batch: every row's loss mask from its turns (hint_tokens where
    it has none), per-token turn advantages, advantage overrides and the token share."""
    import pyarrow as pa

    from gfcr.core.trajectory import TURNS_TYPE
    from gfcr.core.trajectory import Trajectory
    from stages.train.masks import for_batch

    episode = (Trajectory().start_ids([1]).force([2], [-0.1]).add_policy([3, 4], [-0.2, -0.3])
               .add_observation([5], "tool").add_policy([6], [-0.4]))
    batch = pa.table({
        "completion_ids": pa.array([[2, 3, 4, 5, 6], [7, 8, 9]], pa.list_(pa.int32())),
        "turns": pa.array([episode.rows(), None], TURNS_TYPE),
        "hint_tokens": pa.array([0, 1], pa.int32()),
        "turn_advantages": pa.array([[None, None, 0.5, None, None], None],
                                    pa.list_(pa.float64())),
        "d3s_advantage": pa.array([None, 2.0], pa.float64()),
        "token_keep_ratio": pa.array([0.5, 0.25], pa.float64())})
    marks = for_batch(batch)
    assert [m.tolist() for m in marks.masks] == [[False, True, True, False, True],
                                                 [False, True, True]]
    assert marks.advantages(np.array([0.0, 1.0])).tolist() == [0.0, 2.0]
    assert marks.signal(np.array([0.0, 0.0])).tolist() == [1.0, 0.0]  # row 0's turn credit
    tokens = marks.token_advantages([0, 1], [-1.0, 2.0])
    assert [t.tolist() for t in tokens] == [[-1.0, 0.5, 0.5, -1.0, -1.0], [2.0] * 3]
    assert marks.keep_ratio == 0.5
    short = batch.set_column(0, "completion_ids", pa.array([[2, 3], [7, 8, 9]],
                                                           pa.list_(pa.int32())))
    with pytest.raises(ValueError, match="batch row 0 has 5 completion tokens in its turns"):
        for_batch(short)
