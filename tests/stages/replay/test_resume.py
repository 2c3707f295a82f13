"""Exact resume for the store-backed selectors and Rollout Replay.

gfcr.launch.run always starts a run at step 0, so a stop and resume is driven here through the
loop itself (tests.resources.control.runtime, as gfcr.launch.run builds it): a run stopped after
step 1 and continued in a new runtime from the learner's checkpoint commits exactly the
rows of an uninterrupted run. And at the stage level: called later, with History as of
step k while more steps have been committed since, every selector selects — and Rollout
Replay replays — exactly what it did at step k + 1.
"""

from __future__ import annotations

import pyarrow.compute as pc

from gfcr.core.rollout import PROMPT_SCHEMA, col
from gfcr.runner.loop import run_step
from stages import (DOTS, GRPO, VADE, DynamicSampling, GroupSample, InSight, PromptGDRO,
                    RolloutReplay, Verify)
from stages.replay._reads import as_rollouts
from store import RolloutStore
from tests.conftest import tiny_pipeline
from tests.resources.control import local_call, runtime
from tests.resources.digits import Digits
from tests.resources.replay import context

STEPS = 4
KEYS = [col.ROLLOUT_ID, col.PROMPT_ID, col.PARENT_ID, col.REPLAY_COUNT, col.COMPLETION_IDS,
        col.POLICY_VERSION_START, col.ADVANTAGE]


def _pipeline():
    """Each selector adds one prompt; replay tops the batch up with recent groups."""
    return tiny_pipeline(task=Digits(), steps=STEPS, stages=[
        InSight(batch=1, rollouts=4), VADE(batch=2, rollouts=4), DOTS(batch=3, candidates=6),
        PromptGDRO(batch=4, bins=2), RolloutReplay(groups=8, max_share=0.5, window=2),
        GroupSample(n=4, max_tokens=4), Verify(), DynamicSampling(), GRPO(lr=1e-3)])


def _rows(store, step):
    return store.sql("SELECT * FROM rollouts WHERE step = $s ORDER BY rollout_id",
                     {"s": step}).select(KEYS).to_pylist()


def test_a_stopped_and_resumed_run_commits_what_an_uninterrupted_run_does(tmp_path):
    p = _pipeline()
    with RolloutStore.open(tmp_path / "a") as a, RolloutStore.open(tmp_path / "b") as b:
        rt = runtime(p, a, "r")
        for step in range(STEPS):
            run_step(rt, "r", step, local_call)
        rt = runtime(p, b, "r")
        for step in range(2):
            run_step(rt, "r", step, local_call)
        checkpoint = rt.services.learner.state_dict(), rt.services.learner.version
        del rt  # the process stops; a new one rebuilds everything from the spec
        policy = p.policy.build(seed=p.seed)
        policy.version = checkpoint[1]
        resumed = runtime(p, b, "r", policy=policy)
        resumed.services.learner.load_state_dict(checkpoint[0])
        for step in range(2, STEPS):
            run_step(resumed, "r", step, local_call)
        replayed = a.sql("SELECT count(*) AS n FROM rollouts WHERE replay_count > 0")
        assert replayed.column("n")[0].as_py() > 0, "the test needs replayed rows to mean anything"
        for step in range(STEPS):
            assert _rows(b, step) == _rows(a, step)


def test_stages_called_later_with_history_as_of_k_choose_what_they_chose(tmp_path):
    p = _pipeline()
    selectors = [s for s in p.stages if hasattr(s, "select")]
    replay = p.stage("rollout_replay")
    with RolloutStore.open(tmp_path / "a") as store:
        rt = runtime(p, store, "r")
        for step in range(STEPS):
            run_step(rt, "r", step, local_call)
        for step in range(1, STEPS):  # every step after it is committed already
            ctx = context(store, p.task, step)
            chosen = PROMPT_SCHEMA.empty_table()
            for s in selectors:
                chosen = s.select(ctx, chosen)
            committed = store.sql("SELECT * FROM rollouts WHERE step = $s ORDER BY group_id, sample_idx",
                                  {"s": step})
            fresh = committed.filter(pc.equal(committed.column(col.REPLAY_COUNT), 0))
            assert sorted(chosen.column(col.PROMPT_ID).to_pylist()) == \
                sorted(set(fresh.column(col.PROMPT_ID).to_pylist()))
            again = replay.augment(ctx, as_rollouts(fresh))
            parents = again.filter(pc.greater(again.column(col.REPLAY_COUNT), 0)).column(col.PARENT_ID)
            stored = committed.filter(pc.greater(committed.column(col.REPLAY_COUNT), 0)).column(col.PARENT_ID)
            assert sorted(parents.to_pylist()) == sorted(stored.to_pylist())
