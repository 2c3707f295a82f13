"""IGPO's information-gain turn rewards (stages.filter.igpo) with a real tiny policy: golden
values computed here from the model's own logits, independently of the learner's pass."""

from dataclasses import replace

import numpy as np
import pyarrow as pa
import pytest
import torch

from gfcr.core.rollout import TURN_ADVANTAGES
from gfcr.core.trajectory import TURNS_TYPE
from gfcr.runner.inprocess import LocalLearner
from stages import GRPO, IGPO
from tests.resources.agentic import turn
from tests.resources.rollouts import context, rollouts
from tests.stages.train.conftest import TINY


def _episode(tok, *texts):
    """Prompt, then policy / environment turns alternating, from ``texts``."""
    turns = [turn("environment", tok.encode("Q: 2 + 3 * 4 = ?"))]
    for k, text in enumerate(texts):
        turns.append(turn("policy" if k % 2 == 0 else "environment", tok.encode(text)))
    return turns


def _answer_prob(model, context_ids, answer_ids):
    """exp(mean log p) of ``answer_ids`` after ``context_ids``: one forward pass, by hand."""
    ids = torch.tensor([context_ids + answer_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].double()
    logp = torch.log_softmax(logits, dim=-1)
    n = len(context_ids)
    picked = [logp[n - 1 + j, a].item() for j, a in enumerate(answer_ids)]
    return float(np.exp(np.mean(picked)))


def test_golden_information_gain_advantages():
    policy = TINY.build(seed=0)
    tok = policy.tokenizer
    trajectories = [_episode(tok, "3*4", "12", "2+12", "14", "14"),
                    _episode(tok, "2+3", "5", "5*4", "20", "20")]
    table = rollouts(["g", "g"], [1.0, 0.0])
    table = table.set_column(table.column_names.index("turns"), "turns",
                             pa.array(trajectories, TURNS_TYPE))
    teacher = LocalLearner(policy, GRPO().learner(policy, seed=0))
    ctx = replace(context(), teacher=teacher)
    out = IGPO(gamma=0.5, answer_format="A: {answer}").apply(ctx, table).table

    answer = tok.encode("A: 42")  # rollouts() gives every row the answer "42"
    rewards = []
    for trajectory, outcome in zip(trajectories, [1.0, 0.0]):
        flat = [[i for t in trajectory[:k] for i in t["token_ids"]] for k in (1, 3, 5)]
        p = [_answer_prob(policy.model, c, answer) for c in flat]
        rewards.append([p[1] - p[0], p[2] - p[1], outcome])
    values = np.array(rewards).ravel()
    z = ((values - values.mean()) / (values.std(ddof=1) + 1e-6)).reshape(2, 3)
    want = [[z[i, 0] + 0.5 * z[i, 1] + 0.25 * z[i, 2], z[i, 1] + 0.5 * z[i, 2], z[i, 2]]
            for i in range(2)]
    got = out.column(TURN_ADVANTAGES).to_pylist()
    for g, w in zip(got, want):
        assert [g[k] is None for k in range(6)] == [True, False, True, False, True, False]
        assert [g[1], g[3], g[5]] == pytest.approx(w, rel=1e-4, abs=1e-6)
    stored = [[t["reward"] for t in row if t["source"] == "policy"]
              for row in out.column("turns").to_pylist()]
    assert np.allclose(stored, rewards, rtol=1e-4, atol=1e-7)  # the dense rewards, on the turns
    assert rewards[0][0] != 0.0  # the gains are real numbers, not zeros


def test_without_the_learners_teacher_forcing_it_says_where_to_run():
    table = rollouts(["g"], [1.0])
    with pytest.raises(ValueError, match="teacher forcing.*not on engine workers"):
        IGPO().apply(context(), table)
