"""Group sampling with variable group sizes: the plan's ``n`` column, 0 included."""

from __future__ import annotations

from collections import Counter
from typing import ClassVar, Literal

import pyarrow as pa

from gfcr.core.rollout import col
from gfcr.core.stage import StageSpec
from gfcr.core.registry import register
from gfcr.launch.run import execute
from stages import GroupSample, UniformSampler, Verify
from store import RolloutStore
from tests.conftest import tiny_pipeline
from tests.resources.rollouts import context
from tests.resources.scripted import ScriptedEngine
from tests.stages.generate.test_tree import _plan


@register("control")
class _SizesByPosition(StageSpec):
    """Test allocator: prompt i of the plan gets ``sizes[i % len(sizes)]`` samples."""

    type: Literal["_sizes_by_position"] = "_sizes_by_position"
    sizes: tuple[int, ...] = (1, 3, 0, 2)
    writes: ClassVar[frozenset[str]] = frozenset({"n"})

    def allocate(self, ctx, plan):
        n = [self.sizes[i % len(self.sizes)] for i in range(plan.num_rows)]
        return plan.append_column("n", pa.array(n, pa.int64()))


def test_the_plan_sets_each_group_size_and_zero_means_none():
    plan = _plan("P:", "Q:", "S:", "A:", n=[1, 3, 0, 2])
    out = GroupSample(n=8).generate(context(), plan, ScriptedEngine({}), None)
    sizes = Counter(out.column(col.PROMPT).to_pylist())
    assert sizes == {"P:": 1, "Q:": 3, "A:": 2}
    for prompt in ("Q:", "A:"):
        rows = out.filter(pa.compute.equal(out[col.PROMPT], prompt)).to_pylist()
        assert sorted(r[col.SAMPLE_IDX] for r in rows) == list(range(sizes[prompt]))
        assert len({r[col.GROUP_ID] for r in rows}) == 1
    without = GroupSample(n=3).generate(context(), _plan("P:", "Q:"), ScriptedEngine({}), None)
    assert without.num_rows == 6  # no n column: the stage's n


def test_variable_group_sizes_through_the_loop(tmp_path):
    p = tiny_pipeline(steps=1, stages=[UniformSampler(batch=4), _SizesByPosition(),
                                       GroupSample(n=8, max_tokens=2), Verify()])
    summary = execute(p, root=tmp_path, executor="local")
    with RolloutStore.open(tmp_path / "store", read_only=True) as s:
        t = s.sql(f"SELECT group_id, count(*) AS n FROM rollouts WHERE run_id = "
                  f"'{summary.run_id}' GROUP BY group_id")
    assert sorted(t["n"].to_pylist()) == [1, 2, 3]
