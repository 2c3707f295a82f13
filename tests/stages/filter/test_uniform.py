"""Filters act the same whatever the generator (slime #2014: a sample filter silently
skipped when a custom rollout function was used)."""

from __future__ import annotations

from collections import Counter

import pyarrow.compute as pc
import pytest

from gfcr.core.rollout import col
from gfcr.launch.run import execute
from stages import (D3S, GroupSample, Overlong, ResampleOnCorrect, TreeRollout, UniformSampler,
                    Verify)
from stages.filter.roc import FORMAT_ERRORS
from stages.generate.tree import BRANCH_POS
from store import RolloutStore
from tests.conftest import tiny_pipeline
from tests.resources.rollouts import context

FILTERS = [Verify(), Overlong(), ResampleOnCorrect(group_size=2), D3S(keep=0.5, relax_steps=10)]
GENERATORS = {
    "group": GroupSample(n=4, max_tokens=3),
    "latr": TreeRollout(n=4, max_tokens=3, branch_prob=0.012, lookahead=1),
}


@pytest.fixture(scope="module", params=list(GENERATORS))
def stored(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(request.param)
    p = tiny_pipeline(steps=1, stages=[UniformSampler(batch=4), GENERATORS[request.param],
                                       *FILTERS])
    summary = execute(p, root=root, executor="local")
    with RolloutStore.open(root / "store", read_only=True) as s:
        table = s.sql(f"SELECT * FROM rollouts WHERE run_id = '{summary.run_id}'")
    return request.param, table.to_pylist()


def test_every_filter_saw_every_complete_rollout(stored):
    label, rows = stored
    complete = [r for r in rows if r[col.STATUS] == "complete"]
    assert len(complete) == 16
    for r in complete:
        assert r[col.REWARD] is not None and dict(r[col.REWARDS]).keys() == {"verify"}
        assert r[FORMAT_ERRORS] is not None  # RoC ran on it
        if r[col.FINISH_REASON] == "length":
            assert (r[col.KEPT], r[col.DROPPED_BY]) == (False, "overlong")
    kept = Counter(r[col.GROUP_ID] for r in complete if r[col.KEPT])
    assert max(kept.values(), default=0) <= 2  # RoC's group size, then D3S's share
    for r in rows:
        if r[col.STATUS] != "complete":  # never shown to a filter
            assert r[col.REWARD] is None and r[col.DROPPED_BY] == label


def test_filter_decisions_do_not_depend_on_generator_columns():
    p = tiny_pipeline()
    engine = p.engine.build(p.policy.build(seed=0), seed=0)
    tree = GENERATORS["latr"].generate(context(task=p.task), p.task.train_prompts().slice(0, 4),
                                       engine, None)
    tagged = tree.filter(pc.equal(tree[col.STATUS], "complete"))
    assert pc.sum(pc.is_valid(tagged[BRANCH_POS])).as_py() > 0
    plain = tagged.drop_columns([BRANCH_POS])
    for stage in FILTERS:  # a fresh context each: the same random draws for both
        a = stage.apply(context(task=p.task), plain)
        b = stage.apply(context(task=p.task), tagged)
        assert (a.keep, a.reason) == (b.keep, b.reason), stage.label
        if stage is FILTERS[0]:  # later filters see the scores, as in the loop
            plain, tagged = a.table, b.table
