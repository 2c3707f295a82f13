"""Per-turn advantages in the learner (gfcr.core.rollout.TURN_ADVANTAGES): each loss token of a
turn trains on its turn's value, checked against the loss written out by hand."""

import numpy as np
import pyarrow as pa
import pytest
import torch

from gfcr.core.rollout import TURN_ADVANTAGES
from gfcr.core.trajectory import TURNS_TYPE
from stages.train.advantages import lookup_advantage
from stages.train.batching import padded
from stages.train.forward import sequence_logprobs
from stages.train.grpo import GRPO
from stages.train.loss import policy_loss
from tests.stages.train.conftest import TINY, grads, rollouts

REWARDS = [1.0, 0.0, 1.0, 1.0]
GROUPS = ["a", "a", "b", "b"]
LONG = ["123", "9", "12", "14"]  # + EOS: 4, 2, 3, 3 tokens


def _turn(source, ids, logprobs):
    policy = source == "policy"
    return {"role": "tool" if source == "tool" else "assistant", "source": source,
            "token_ids": ids, "logprobs": logprobs if policy else None,
            "mask": [True] * len(ids) if policy else None, "tool_name": None,
            "tool_error": None, "reward": None}


def _multi_turn(batch):
    """Row 0's completion as policy [2 tokens], tool [1 token], policy [1 token]; row 2's
    as policy [1], tool [1], policy [1]; rows 1 and 3 single policy turns."""
    prompts = batch.column("prompt_ids").to_pylist()
    comps = batch.column("completion_ids").to_pylist()
    lps = batch.column("logprobs").to_pylist()
    cuts = {0: [(0, 2, "policy"), (2, 3, "tool"), (3, 4, "policy")],
            2: [(0, 1, "policy"), (1, 2, "tool"), (2, 3, "policy")]}
    turns = []
    for i, (p, c, lp) in enumerate(zip(prompts, comps, lps)):
        first = {**_turn("environment", p, None), "role": "user"}
        parts = cuts.get(i, [(0, len(c), "policy")])
        turns.append([first] + [_turn(s, c[a:b], lp[a:b]) for a, b, s in parts])
    return batch.append_column("turns", pa.array(turns, TURNS_TYPE))


def _hand(policy, batch, token_adv, mask_of):
    model = policy.model
    model.zero_grad(set_to_none=True)
    new, mask = sequence_logprobs(model, batch.column("prompt_ids").to_pylist(),
                                  batch.column("completion_ids").to_pylist(), 1.0,
                                  policy.tokenizer.pad_token_id)
    old = padded(batch.column("logprobs").to_pylist(), mask.shape[1])
    adv = padded(token_adv, mask.shape[1])
    loss, _ = policy_loss(new, old, adv, mask_of(mask.clone()), clip_low=0.2,
                          clip_high=0.28, aggregation="seq_mean")
    loss.backward()
    return loss.item(), grads(model)


def test_each_turn_trains_on_its_advantage_and_tool_tokens_not_at_all():
    policy = TINY.build(seed=0)
    batch = _multi_turn(rollouts(policy, REWARDS, GROUPS, completions=LONG))
    row = lookup_advantage("grpo")(np.array(REWARDS), np.array(GROUPS))  # (.707, -.707, 0, 0)
    # row 0: turn advantages for its two policy turns; row 1: null list (row advantage);
    # row 2: only its second policy turn (its row advantage is 0: group b is flat)
    given = [[None, 0.3, None, -0.9], None, [None, None, None, 0.5], [None, None]]
    batch = batch.append_column(TURN_ADVANTAGES, pa.array(given, pa.list_(pa.float64())))
    learner = GRPO().learner(policy, seed=0)
    loss = learner.loss_and_gradients(None, batch)
    got = grads(policy.model)
    token_adv = [[0.3, 0.3, 0.0, -0.9], [row[1]] * 2, [0.0, 0.0, 0.5], [0.0] * 3]

    def mask_of(mask):
        mask[0, 2] = mask[2, 1] = False  # the tool tokens
        mask[3, :] = False               # row 3 has no signal: not trained
        return mask
    want_loss, want = _hand(policy, batch, token_adv, mask_of)
    assert loss == pytest.approx(want_loss, rel=1e-6)
    for a, b in zip(got, want):
        assert torch.allclose(a, b, rtol=1e-6, atol=1e-6)
    # and not the gradient of the row advantages alone
    learner.loss_and_gradients(None, batch.drop_columns([TURN_ADVANTAGES]))
    assert any(not torch.allclose(a, b) for a, b in zip(got, grads(policy.model)))


def test_turn_advantages_of_the_wrong_length_are_refused_naming_the_row():
    policy = TINY.build(seed=0)
    batch = _multi_turn(rollouts(policy, REWARDS, GROUPS, completions=LONG))
    batch = batch.append_column(TURN_ADVANTAGES, pa.array(
        [[None, 1.0], None, None, None], pa.list_(pa.float64())))
    with pytest.raises(ValueError, match=r"batch row 0 has 2 'turn_advantages' but 4 turns"):
        GRPO().learner(policy, seed=0).update(None, batch)
