"""Runtime overhead of a default step: Prefect tasks, staging, store commit, MLflow.

Two runs of the same pipeline from the same warm-started weights and seed do identical
work: a *bare* one (the loop called in-process, tables in memory, no store, no tracking)
and a *full* one (``gfcr.execute`` under Prefect, Arrow files staged between tasks, each
step committed to the store, metrics to MLflow). A step's time is the gap between two
consecutive step-end events, so the full figure includes the commit and the logging of
the step before. Overhead = 1 - bare / full, on the median step.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from gfcr.loop import Runtime, run_step
from gfcr.pipeline import Pipeline
from gfcr.run import MemoryStash, execute


class _Clock:
    def __init__(self) -> None:
        self.marks: list[float] = []

    def on_step(self, **_: Any) -> None:
        self.marks.append(time.perf_counter())

    def gaps(self) -> list[float]:
        return [b - a for a, b in zip(self.marks, self.marks[1:])]


def _bare_steps(pipeline: Pipeline, cache: Path) -> list[float]:
    policy = pipeline.policy.build(seed=pipeline.seed)
    engine = pipeline.engine.build(policy, seed=pipeline.seed)  # sets CPU threads first
    if pipeline.warmstart is not None:
        pipeline.warmstart.run(policy, pipeline.task, seed=pipeline.seed, cache_dir=cache)
    learner = pipeline.of_kind("train")[0].learner(policy, seed=pipeline.seed)
    rt = Runtime(pipeline=pipeline, task=pipeline.task, engine=engine, learner=learner,
                 stash=MemoryStash())
    clock = _Clock()
    clock.on_step()
    for step in range(pipeline.steps):
        run_step(rt, "bare", step, lambda name, fn, *args: fn(*args))
        clock.on_step()
    return clock.gaps()


def _full_steps(pipeline: Pipeline, root: Path, cache: Path) -> list[float]:
    from gfcr.tracking import MlflowHook

    (root / "cache").symlink_to(cache.resolve(), target_is_directory=True)
    clock = _Clock()
    execute(pipeline, root=root, executor="prefect", hooks=[clock, MlflowHook()])
    return clock.gaps()  # gap k: step k+1 (with its commit) and the logging of step k


def runtime_overhead(pipeline: Pipeline, *, steps: int = 6,
                     cache: Path = Path(".gfcr/cache")) -> dict[str, float]:
    """Median seconds per step, bare and full, and the overhead share. The warm start is
    shared with ``gfcr run`` through ``cache`` (trained there once if missing)."""
    pipeline = pipeline.with_overrides([f"steps={steps}"])
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        bare = _bare_steps(pipeline, cache)[1:]  # steps 1.., as in the full run
        full = _full_steps(pipeline, root, cache)
    bare_s, full_s = statistics.median(bare), statistics.median(full)
    return {"bare_step_s": bare_s, "full_step_s": full_s,
            "runtime_overhead": max(0.0, 1.0 - bare_s / full_s)}
