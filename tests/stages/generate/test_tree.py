"""LATR tree rollouts: branch points, lookahead pruning, lineage, and the real loop."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
import torch

from gfcr.core.engine import FnHook
from gfcr.core.rollout import PROMPT_SCHEMA, col, prompt_id
from gfcr.launch.run import execute
from stages import HF, GRPO, ReasoningGym, TinyLlama, TreeRollout, UniformSampler, Verify
from stages.engines.hf_sampling import token_logprobs
from stages.generate.tree import BRANCH_POS, edit_ratio
from store import LakeHistory, RolloutStore
from tests.conftest import SUMS, tiny_pipeline
from tests.resources.rollouts import context
from tests.resources.scripted import ScriptedEngine

SCRIPT = {
    # P: uncertain first token; the two branches say different things -> both kept
    "P:": {"1": 0.55, "2": 0.45}, "P:1": {"a": 1}, "P:1a": {"b": 1}, "P:1ab": {"c": 1},
    "P:2": {"x": 1}, "P:2x": {"y": 1}, "P:2xy": {"z": 1},
    # Q: uncertain first token, but both branches continue alike -> the branch is pruned
    "Q:": {"a": 0.6, "b": 0.4}, "Q:a": {"x": 1}, "Q:ax": {"y": 1}, "Q:b": {"x": 1},
    "Q:bx": {"y": 1},
    # S: branches end inside the lookahead window ("ax" vs "bx": distance 0.5)
    "S:": {"a": 0.5, "b": 0.5}, "S:a": {"x": 1}, "S:b": {"x": 1},
}


def _plan(*prompts, n=None):
    rows = [{"prompt_id": prompt_id("t", p), "task": "t", "prompt": p, "answer": None,
             "meta": None} for p in prompts]
    table = pa.Table.from_pylist(rows, schema=PROMPT_SCHEMA)
    return table if n is None else table.append_column("n", pa.array(n, pa.int64()))


def _grow(stage, *prompts, n=None):
    engine = ScriptedEngine(SCRIPT)
    out = stage.generate(context(), _plan(*prompts, n=n), engine, None)
    return out.sort_by([(col.PROMPT, "ascending"), (col.SAMPLE_IDX, "ascending")]), engine


def _view(table):
    return [(r[col.SAMPLE_IDX], r[BRANCH_POS], r[col.COMPLETION], r[col.STATUS])
            for r in table.to_pylist()]


def test_edit_ratio():
    assert edit_ratio("abc", "abc") == 0.0
    assert edit_ratio("bxy", "axy") == pytest.approx(1 / 3)
    assert edit_ratio("", "ab") == 1.0 and edit_ratio("kitten", "sitting") == pytest.approx(3 / 7)


def test_distinct_branches_survive_and_look_alikes_are_pruned():
    out, engine = _grow(TreeRollout(n=2, lookahead=2, min_distance=0.4), "P:", "Q:")
    p, q = out.slice(0, 2), out.slice(2, 3)
    assert _view(p) == [(0, None, "1abc", "complete"), (1, 0, "2xyz", "complete")]
    # "bxy" vs "axy" after the lookahead: distance 1/3 < 0.4 -> pruned; a fresh root fills in
    assert _view(q) == [(0, None, "axy", "complete"), (1, 0, "bxy", "pruned"),
                        (2, None, "axy", "complete")]
    rows = out.to_pylist()
    assert rows[1][col.PARENT_ID] == rows[0][col.ROLLOUT_ID]
    assert rows[3][col.PARENT_ID] == rows[2][col.ROLLOUT_ID] and rows[4][col.PARENT_ID] is None
    assert rows[1][col.LOGPROBS] == pytest.approx([math.log(0.45), 0, 0, 0, 0])
    assert len({r[col.GROUP_ID] for r in rows[:2]}) == 1 and rows[0][col.GROUP_ID] != rows[2][col.GROUP_ID]
    # the shared prefix is generated once: the branch request carries it as prefix_ids
    assert engine.calls[1][0].prefix_ids == [ord("2")]


def test_a_branch_that_ends_inside_the_lookahead_is_checked_when_it_ends():
    out, _ = _grow(TreeRollout(n=2, lookahead=4, min_distance=0.4), "S:")
    assert _view(out) == [(0, None, "ax", "complete"), (1, 0, "bx", "complete")]  # 0.5 apart
    out, _ = _grow(TreeRollout(n=2, lookahead=4, min_distance=0.6), "S:")
    assert _view(out)[1] == (1, 0, "bx", "pruned")


def test_branch_threshold_and_plan_group_sizes():
    out, _ = _grow(TreeRollout(n=2, branch_prob=0.5), "P:")  # 0.45 < 0.5: no branch point
    assert [r[BRANCH_POS] for r in out.to_pylist()] == [None, None]
    out, _ = _grow(TreeRollout(n=2, lookahead=2), "P:", "Q:", n=[1, 0])
    assert _view(out) == [(0, None, "1abc", "complete")]


def test_segment_hooks_of_control_stages_still_run():
    seen = []

    def hook(inflight):
        seen.extend(v.key for v in inflight)
        return {}
    engine = ScriptedEngine(SCRIPT)
    TreeRollout(n=2, lookahead=2).generate(context(), _plan("P:"), engine, FnHook(hook))
    assert seen


@pytest.fixture(scope="module")
def tiny():
    task = ReasoningGym(train_size=16, heldout_size=4, config=SUMS)
    # the char vocabulary: a near-uniform tiny model then branches at 1.2% (not over 259 ids)
    policy = TinyLlama(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64,
                       tokenizer="char").build(seed=0)
    return task, policy, HF(device="cpu").build(policy, seed=0)


def test_real_model_trees_share_prefixes_and_record_true_logprobs(tiny):
    task, policy, engine = tiny
    stage = TreeRollout(n=4, branch_prob=0.012, lookahead=2, max_tokens=6)
    out = stage.generate(context(task=task), task.train_prompts().slice(0, 3), engine, None)
    rows = {r[col.ROLLOUT_ID]: r for r in out.to_pylist()}
    complete = [r for r in rows.values() if r[col.STATUS] == "complete"]
    assert sorted(np.unique([r[col.GROUP_ID] for r in complete], return_counts=True)[1]) == [4, 4, 4]
    children = [r for r in rows.values() if r[BRANCH_POS] is not None]
    assert children, "a near-uniform tiny model should branch at 1.2%"
    for child in children:
        parent, at = rows[child[col.PARENT_ID]], child[BRANCH_POS]
        assert child[col.COMPLETION_IDS][:at] == parent[col.COMPLETION_IDS][:at]
        assert child[col.COMPLETION_IDS][at] != parent[col.COMPLETION_IDS][at]
        assert child[col.LOGPROBS][:at] == parent[col.LOGPROBS][:at]
        with torch.no_grad():
            forced = token_logprobs(policy.model, child[col.PROMPT_IDS], child[col.COMPLETION_IDS])
        assert forced.tolist() == pytest.approx(child[col.LOGPROBS], abs=1e-4)


def test_tree_rollouts_run_in_the_loop_with_lineage_in_the_store(tmp_path):
    p = tiny_pipeline(steps=1, stages=[
        UniformSampler(batch=2), TreeRollout(n=4, branch_prob=0.012, lookahead=2, max_tokens=4),
        Verify(), GRPO(lr=1e-3)])
    summary = execute(p, root=tmp_path, executor="local")
    with RolloutStore.open(tmp_path / "store", read_only=True) as s:
        t = s.sql(f"SELECT * FROM rollouts WHERE run_id = '{summary.run_id}'")
        child = t.filter(pc.is_valid(t[BRANCH_POS])).to_pylist()[0]
        chain = LakeHistory(s, run_id=summary.run_id).lineage(child[col.ROLLOUT_ID]).to_pylist()
    assert [c["rollout_id"] for c in chain][:2] == [child[col.ROLLOUT_ID], child[col.PARENT_ID]]
    complete = t.filter(pc.equal(t[col.STATUS], "complete"))
    assert complete.num_rows == 8 and pc.all(pc.is_valid(complete[col.REWARD])).as_py()
    pruned = t.filter(pc.equal(t[col.STATUS], "pruned"))
    assert all(r is None for r in pruned[col.REWARD].to_pylist())  # filters never see them
    assert set(pruned[col.DROP_REASON].to_pylist()) <= {"pruned"}
