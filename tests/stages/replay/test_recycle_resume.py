"""Exact resume with partial rollouts pending: the buffer is the store (OpenRLHF #1322
dropped its buffered rollouts on resume)."""

from __future__ import annotations

from gfcr.core.rollout import col
from gfcr.runner.loop import run_step
from store import RolloutStore
from tests.resources.control import april_pipeline, local_call, runtime

KEYS = [col.ROLLOUT_ID, col.PARENT_ID, col.GROUP_ID, col.STATUS, col.COMPLETION_IDS,
        col.POLICY_VERSION_START]


def _step(store, step):
    return store.sql("SELECT * FROM rollouts WHERE step = $s ORDER BY rollout_id",
                     {"s": step}).select(KEYS).to_pylist()


def test_a_resumed_run_recycles_exactly_the_partials_it_left(tmp_path):
    p = april_pipeline(steps=3)
    with RolloutStore.open(tmp_path / "a") as a, RolloutStore.open(tmp_path / "b") as b:
        rt = runtime(p, a, "r")
        for step in range(3):
            run_step(rt, "r", step, local_call)
        rt = runtime(p, b, "r")
        for step in range(2):
            run_step(rt, "r", step, local_call)
        checkpoint = rt.services.learner.state_dict(), rt.services.learner.version
        pending = b.sql("SELECT rollout_id FROM rollouts WHERE step = 1 AND status = "
                        "'partial'").column(col.ROLLOUT_ID).to_pylist()
        del rt  # the process stops; a new one rebuilds everything from the spec
        policy = p.policy.build(seed=p.seed)
        policy.version = checkpoint[1]
        resumed = runtime(p, b, "r", policy=policy)
        resumed.services.learner.load_state_dict(checkpoint[0])
        run_step(resumed, "r", 2, local_call)
        assert pending, "step 1 must leave partials for this test to mean anything"
        continued = {r[col.PARENT_ID] for r in _step(b, 2) if r[col.PARENT_ID]}
        assert continued == set(pending)
        assert _step(b, 2) == _step(a, 2)
