"""The learner's masks and off-policy correction through the real loop and store."""

from __future__ import annotations

from gfcr.launch.run import execute
from stages import (D3S, GRPO, ConditionedSample, DynamicSampling, Exemplars, GroupSample,
                    Hints, RolloutReplay, UniformSampler, Verify)
from tests.conftest import tiny_pipeline
from tests.resources.digits import Digits


def digit_share(completion: str, answer: str | None, meta: str | None) -> float:
    """A dense reward the random tiny policy earns some of: digits among 4 characters."""
    return sum(c.isdigit() for c in completion[:4]) / 4


def test_hints_and_d3s_masks_train_through_the_loop(tmp_path):
    p = tiny_pipeline(steps=2, stages=[
        UniformSampler(batch=3),
        ConditionedSample(sample=GroupSample(n=4, max_tokens=4),
                          hints=Hints(max_ratio=1.0, share=0.5), exemplars=Exemplars(k=1)),
        Verify(scorer=f"{__name__}:digit_share"), D3S(keep=0.75, token_keep=0.5, relax_steps=4), GRPO(lr=1e-3)])
    summary = execute(p, root=tmp_path, executor="local")
    trained = [m for m in summary.history if m.get("train/n_seqs", 0) > 0]
    assert trained, "the dense reward gives the tiny policy groups with signal"
    for m in trained:
        assert 0 < m["train/loss_token_share"] < 1  # hint tokens and D3S's share masked
        assert m["train/offpolicy_share"] == 0.0


def test_replayed_rows_are_corrected_and_their_staleness_reported(tmp_path):
    p = tiny_pipeline(task=Digits(), steps=3, stages=[
        UniformSampler(batch=2), RolloutReplay(groups=4, window=2),
        GroupSample(n=4, max_tokens=4), Verify(), DynamicSampling(), GRPO(lr=1e-3)])
    summary = execute(p, root=tmp_path, executor="local")
    first, *later = summary.history
    assert first["train/offpolicy_share"] == 0.0 and first["train/is_weight_mean"] == 1.0
    replayed = [m for m in later if m["train/offpolicy_share"] > 0]
    assert replayed, "the digits task keeps groups with signal: steps 1 and 2 replay some"
    for m in replayed:
        assert m["train/staleness_mean"] >= 1 and m["train/staleness_max"] <= 2
        assert 0 < m["train/is_weight_mean"] <= 2.0
        assert 0 <= m["train/is_truncated_share"] <= 1
