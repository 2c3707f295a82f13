"""Helpers for the Control and recycling tests: a scorer that records what it scored, a
pipeline whose rollout lengths vary (a tiny random policy stopped by any digit, so lengths
are roughly geometric), and a loop runtime that can be stopped and built again (resume).
"""

from __future__ import annotations

from typing import Any

from gfcr.core.policy import Policy
from gfcr.core.pipeline import Pipeline
from gfcr.launch.run import MemoryStash
from gfcr.runner.inprocess import local_services
from gfcr.runner.loop import Runtime
from gfcr.runner.runtime import Record
from stages import (GRPO, ActivePartialRollouts, GroupSample, RecyclePartials, UniformSampler,
                    Verify)
from store import LakeHistory
from tests.conftest import tiny_pipeline
from tests.resources.digits import Digits

DIGITS = tuple("0123456789")
SCORED: list[str] = []
"""Completions the recording scorer was called with, in order."""


def recording_score(completion: str, answer: Any, meta: Any) -> float:
    """The digits task's score, remembering every completion it was asked about."""
    SCORED.append(completion)
    return Digits().score(completion, answer, meta)


def april_pipeline(*, steps: int = 3, max_staleness: int = 4, **gen: Any) -> Pipeline:
    """Recycle, sample 6 prompts, stop at 4 complete groups of 4, score, train."""
    sample = dict(n=4, max_tokens=24, segment_tokens=2, stop=DIGITS) | gen
    return tiny_pipeline(task=Digits(), steps=steps, stages=[
        RecyclePartials(max_staleness=max_staleness), UniformSampler(batch=6),
        ActivePartialRollouts(over_provision=1.5), GroupSample(**sample),
        Verify(scorer="tests.resources.control:recording_score", worker=False),
        GRPO(lr=1e-3)])


def runtime(pipeline: Pipeline, store: Any, run_id: str, policy: Policy | None = None
            ) -> Runtime:
    """What ``gfcr.launch.run`` builds for a run (no warm start), on a given or fresh policy."""
    policy = policy or pipeline.policy.build(seed=pipeline.seed)
    engine = pipeline.engine.build(policy, seed=pipeline.seed)
    learner = pipeline.of_kind("train")[0].learner(policy, seed=pipeline.seed)
    store.start_run(run_id, pipeline=pipeline.name, spec_yaml=pipeline.to_yaml(),
                    spec_hash=pipeline.spec_hash(), code_version="test")

    def history(step: int) -> LakeHistory:
        return LakeHistory(store, run_id, as_of_step=step - 1) if step else LakeHistory(store, run_id)
    return Runtime(pipeline=pipeline, task=pipeline.task,
                   services=local_services(engine, policy, learner), stash=MemoryStash(),
                   record=Record(commit=store.commit_step, history_at=history))


def local_call(name: str, fn: Any, *args: Any) -> Any:
    return fn(*args)
