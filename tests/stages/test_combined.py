"""Several Generate and Filter operators of issue 5 in one pipeline, built and run."""

from __future__ import annotations

import pyarrow.compute as pc
import pytest

from gfcr.core.pipeline import PipelineError
from gfcr.core.rollout import col
from gfcr.launch.run import execute
from stages import (D3S, GRPO, ConditionedSample, DynamicSampling, Exemplars, GroupSample,
                    Hints, Overlong, ResampleOnCorrect, TreeRollout, UniformSampler, Verify)
from stages.filter.d3s import D3S_ADVANTAGE, TOKEN_KEEP_RATIO
from stages.filter.roc import FORMAT_ERRORS
from stages.generate.conditioned import HINT_TOKENS
from stages.generate.tree import BRANCH_POS
from store import RolloutStore
from tests.conftest import tiny_pipeline


def _rows(root, run_id):
    with RolloutStore.open(root / "store", read_only=True) as s:
        return s.sql(f"SELECT * FROM rollouts WHERE run_id = '{run_id}'")


def test_tree_verify_penalty_roc_dynamic_d3s_grpo(tmp_path):
    p = tiny_pipeline(steps=2, stages=[
        UniformSampler(batch=3),
        TreeRollout(n=6, branch_prob=0.012, lookahead=2, max_tokens=4),
        Verify(),
        Overlong(mode="penalty", max_tokens=4, buffer=2),
        ResampleOnCorrect(group_size=4),
        DynamicSampling(),
        D3S(keep=0.75, token_keep=0.5, relax_steps=4),
        GRPO(lr=1e-3)])
    summary = execute(p, root=tmp_path, executor="local")
    t = _rows(tmp_path, summary.run_id)
    for extra in (BRANCH_POS, FORMAT_ERRORS, TOKEN_KEEP_RATIO):
        assert extra in t.column_names
    complete = t.filter(pc.equal(t[col.STATUS], "complete"))
    assert complete.num_rows == 2 * 3 * 6
    for r in complete.to_pylist():
        assert {"verify", "overlong"} <= dict(r[col.REWARDS]).keys()
    assert set(complete[col.DROPPED_BY].to_pylist()) <= {None, "roc", "dynamic_sampling", "d3s"}
    assert pc.sum(pc.is_valid(t[col.PARENT_ID])).as_py() > 0
    trained = complete.filter(complete[col.KEPT]).to_pylist()  # on D3S's group advantages
    assert trained and all(r[col.ADVANTAGE] == r[D3S_ADVANTAGE] for r in trained)


def test_conditioned_exact_match_drop_truncated_d3s(tmp_path):
    p = tiny_pipeline(steps=2, stages=[
        UniformSampler(batch=3),
        ConditionedSample(sample=GroupSample(n=4, max_tokens=4), hints=Hints(max_ratio=1.0, share=0.5),
                          exemplars=Exemplars(k=1, after=2)),
        Overlong(),
        Verify(scorer="exact"),
        D3S(keep=0.5),
        GRPO(lr=1e-3)])
    summary = execute(p, root=tmp_path, executor="local")
    t = _rows(tmp_path, summary.run_id)
    assert pc.sum(pc.greater(t[HINT_TOKENS], 0)).as_py() > 0  # 1 of a 2-digit answer
    truncated = t.filter(pc.equal(t[col.FINISH_REASON], "length"))
    assert set(truncated[col.DROPPED_BY].to_pylist()) <= {"overlong"}


def test_filters_that_need_a_reward_must_follow_a_verifier():
    for stage in (ResampleOnCorrect(group_size=2), D3S(), Overlong(mode="penalty", max_tokens=4, buffer=2)):
        with pytest.raises(PipelineError, match=f"stage {stage.label!r} reads column 'reward'"):
            tiny_pipeline(stages=[UniformSampler(batch=2), GroupSample(n=4), stage, Verify()])
