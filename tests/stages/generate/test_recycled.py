"""Recycled partial rollouts (APRIL) with generate stages other than GroupSample:
ConditionedSample continues them with their hints and exemplars; TreeRollout cannot, and
the pipeline refuses RecyclePartials beside it. ``new_tokens`` counts what each row
generated in its own step."""

from __future__ import annotations

import math

import pyarrow as pa
import pytest

from gfcr.core.pipeline import PipelineError
from gfcr.core.rollout import NEW_TOKENS, col, prompt_id
from gfcr.launch.run import execute
from stages import (ActivePartialRollouts, ConditionedSample, Exemplars, GroupSample, Hints,
                    RecyclePartials, TokenBudget, TreeRollout, UniformSampler, Verify)
from stages.generate.conditioned import EXEMPLARS, HINT_TOKENS
from stages.generate.rows import RECYCLE
from stages.generate.tree import BRANCH_POS
from stages.replay.recycle import PLAN_SCHEMA
from store import RolloutStore
from tests.conftest import tiny_pipeline
from tests.resources.control import DIGITS
from tests.resources.rollouts import context
from tests.resources.scripted import EOS, ScriptedEngine
from tests.stages.generate.test_conditioned import SCRIPT, History, Task


def _sample(idx, prefix, *, reason=None, hint=None, exemplars=None, start=0):
    return {"sample_idx": idx, "parent_id": f"old-{idx}", "prefix_ids": prefix,
            "prefix_logprobs": [-1.0] * len(prefix), "policy_version_start": start,
            "policy_version_end": start, "finish_reason": reason, "hint_tokens": hint,
            "exemplars": exemplars}


def _row(text, *, group=None, recycle=None):
    return {"prompt_id": prompt_id("t", "A:"), "task": "t", "prompt": text, "answer": "123",
            "meta": None, col.GROUP_ID: group, "n": None if recycle is None else len(recycle),
            RECYCLE: recycle}


def test_conditioned_sample_continues_a_recycled_group_without_conditioning_it_again():
    stage = ConditionedSample(sample=GroupSample(n=2, max_tokens=8),
                              hints=Hints(max_ratio=1.0, share=0.5),
                              exemplars=Exemplars(k=1, after=1))
    recycled = [_sample(0, [ord("1")], hint=1, exemplars=0),         # continue a hinted one
                _sample(1, [EOS], reason="stop", hint=0, exemplars=0),  # carry a finished one
                _sample(2, [], start=None)]                           # restart a stale one
    plan = pa.Table.from_pylist([_row("A:", group="g-old", recycle=recycled), _row("A:")],
                                schema=PLAN_SCHEMA)
    history = History({"A:": (8, 0), "B:": (4, 2)})  # A: failing -> seeded and hinted if fresh
    out = stage.generate(context(task=Task(), history=history), plan, ScriptedEngine(SCRIPT),
                         None).to_pylist()
    old, fresh = out[:3], out[3:]
    assert [r[col.GROUP_ID] for r in old] == ["g-old"] * 3
    assert [r[col.PARENT_ID] for r in old] == ["old-0", "old-1", "old-2"]
    assert [r[col.PROMPT] for r in old] == ["A:"] * 3  # the stored text: not seeded again
    assert [r[col.COMPLETION_IDS] for r in old] == [[ord("1"), EOS], [EOS], [EOS]]
    assert [r[HINT_TOKENS] for r in old] == [1, 0, 0]  # the stored hint stays masked
    assert [r[NEW_TOKENS] for r in old] == [1, 0, 1]
    assert old[0][col.LOGPROBS] == pytest.approx([-1.0, math.log(0.5)])  # parent's, then new
    # the fresh copy of the same prompt is still seeded and hinted as before
    assert all(r[col.PROMPT] == "B:7\nA:" and r[EXEMPLARS] == 1 for r in fresh)
    assert [r[HINT_TOKENS] for r in fresh] == [0, 2]  # posterior 1/10 -> floor(0.9 * 3)


def test_conditioned_sample_with_april_continues_partials_through_the_loop(tmp_path):
    gen = ConditionedSample(sample=GroupSample(n=4, max_tokens=24, segment_tokens=2,
                                               stop=DIGITS),
                            hints=Hints(max_ratio=1.0, share=0.5), exemplars=None)
    p = tiny_pipeline(steps=3, stages=[RecyclePartials(), UniformSampler(batch=6),
                                       ActivePartialRollouts(over_provision=1.5), gen, Verify()])
    summary = execute(p, root=tmp_path, executor="local")
    with RolloutStore.open(tmp_path / "store", read_only=True) as s:
        rows = s.sql("SELECT * FROM rollouts WHERE run_id = $r", {"r": summary.run_id}).to_pylist()
    by_id = {r[col.ROLLOUT_ID]: r for r in rows}
    children = [r for r in rows if r[col.PARENT_ID]]
    assert children, "APRIL should stop some groups and continue them the next step"
    assert any(r[HINT_TOKENS] for r in children), "some continued sample should carry a hint"
    for child in children:
        parent = by_id[child[col.PARENT_ID]]
        n = len(parent[col.COMPLETION_IDS])
        assert child[col.COMPLETION_IDS][:n] == parent[col.COMPLETION_IDS]
        assert child[HINT_TOKENS] == parent[HINT_TOKENS]
        assert child[NEW_TOKENS] == child[col.N_TOKENS] - n
    continued = {r[col.PARENT_ID] for r in children}
    last = max(r[col.STEP] for r in rows)
    assert all(r[col.ROLLOUT_ID] in continued for r in rows
               if r[col.STATUS] == "partial" and r[col.STEP] < last)


@pytest.mark.parametrize("stop", [ActivePartialRollouts(), TokenBudget(abort="stop")])
def test_recycling_beside_a_tree_is_refused_naming_both_stages_and_why(stop):
    with pytest.raises(PipelineError) as err:
        tiny_pipeline(stages=[RecyclePartials(), UniformSampler(batch=4), stop,
                              TreeRollout(n=2), Verify()])
    (problem,) = [p for p in err.value.problems if "continue" in p]
    assert "stages 'recycle_partials' and 'latr'" in problem
    assert "does not continue partial rollouts" in problem
    assert "picked again every step" in problem and "GroupSample" in problem


def test_generate_stages_that_continue_partials_pass_the_check():
    for gen in (GroupSample(n=2), ConditionedSample(sample=GroupSample(n=2))):
        tiny_pipeline(stages=[RecyclePartials(), UniformSampler(batch=4),
                              ActivePartialRollouts(), gen, Verify()])


TREE = {"R:": {"a": 1}, "R:a": {"1": 0.55, "2": 0.45}, "R:a1": {"x": 1}, "R:a1x": {"y": 1},
        "R:a2": {"p": 1}, "R:a2p": {"q": 1}}
"""One uncertain position, after the first token: the branch shares one token."""


def test_tree_branches_count_only_their_own_tokens():
    plan = pa.Table.from_pylist([_row("R:")], schema=PLAN_SCHEMA).drop_columns([RECYCLE])
    out = TreeRollout(n=2, lookahead=2).generate(context(), plan, ScriptedEngine(TREE), None)
    rows = out.to_pylist()
    assert [(r[BRANCH_POS], r[col.N_TOKENS], r[NEW_TOKENS]) for r in rows] == [
        (None, 5, 5), (1, 5, 4)]  # "a1xy<eos>", then "a" shared + "2pq<eos>"
