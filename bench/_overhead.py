"""Runtime overhead of a default step: Prefect tasks, staging, store commit, MLflow.

The same pipeline runs from the same warm-started weights and seed, doing identical work,
*bare* (the loop called in-process, tables in memory, no store, no tracking), then *full*
(``gfcr.execute`` under Prefect as ``gfcr run`` runs it: its Prefect settings, tables
staged between tasks, each step committed to the store behind the next one, metrics to
MLflow, checkpoints), then bare again, so drift in the machine's load hits both sides.
A step's cost is the gap between two consecutive step-end events (step 0, which pays
one-off warm-up, is left out), so the full figure includes the commit and the logging
of the step before, wherever they ran. Overhead = 1 - bare / full, on the median step.

Two clocks: ``wall`` (what a user waits) and ``process`` (CPU time of this process, all
threads: work moved to a background thread still counts; steadier on a shared machine).
The temporary Prefect server that the run starts is a separate process: its CPU per step
is reported apart (``server_cpu_step_s``), not in either figure.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from gfcr.cli import quiet_prefect
from gfcr.loop import Runtime, run_step
from gfcr.pipeline import Pipeline
from gfcr.run import MemoryStash, execute

CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter,
                                          "process": time.process_time}


def children_cpu() -> float | None:
    """CPU seconds of this process's live descendants (the Prefect server), from /proc;
    None where /proc is missing."""
    if not os.path.isdir("/proc"):
        return None
    parents, cpu = {}, {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            parents[int(entry)] = int(fields[1])
            cpu[int(entry)] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    tree, grew = {os.getpid()}, True
    while grew:
        grew = False
        for pid, parent in parents.items():
            if parent in tree and pid not in tree:
                tree.add(pid)
                grew = True
    return sum(cpu[pid] for pid in tree - {os.getpid()})


class _Clock:
    """Step-end marks on every clock, and the Prefect server's CPU at each mark."""

    def __init__(self) -> None:
        self.marks: dict[str, list[float]] = {name: [] for name in CLOCKS}
        self.server: list[float | None] = []

    def on_step(self, **_: Any) -> None:
        for name, clock in CLOCKS.items():
            self.marks[name].append(clock())
        self.server.append(children_cpu())

    def gaps(self, name: str) -> list[float]:
        marks = self.marks[name]
        return [b - a for a, b in zip(marks, marks[1:])]

    def server_gaps(self) -> list[float]:
        if any(s is None for s in self.server):
            return []
        return [b - a for a, b in zip(self.server, self.server[1:])]  # type: ignore[operator]


def _bare_steps(pipeline: Pipeline, cache: Path) -> _Clock:
    policy = pipeline.policy.build(seed=pipeline.seed)
    engine = pipeline.engine.build(policy, seed=pipeline.seed)  # sets CPU threads first
    if pipeline.warmstart is not None:
        pipeline.warmstart.run(policy, pipeline.task, seed=pipeline.seed, cache_dir=cache)
    learner = pipeline.of_kind("train")[0].learner(policy, seed=pipeline.seed)
    rt = Runtime(pipeline=pipeline, task=pipeline.task, engine=engine, learner=learner,
                 stash=MemoryStash())
    clock = _Clock()
    for step in range(pipeline.steps):
        run_step(rt, "bare", step, lambda name, fn, *args: fn(*args))
        clock.on_step()
    return clock  # gap k: step k+1


def _full_steps(pipeline: Pipeline, root: Path, cache: Path) -> _Clock:
    from gfcr.tracking import MlflowHook

    (root / "cache").symlink_to(cache.resolve(), target_is_directory=True)
    clock = _Clock()
    execute(pipeline, root=root, executor="prefect", hooks=[clock, MlflowHook()])
    return clock  # gap k: step k+1 with the commit and the logging of step k


def _figures(bare: list[float], full: list[float]) -> dict[str, float]:
    bare_s, full_s = statistics.median(bare), statistics.median(full)
    return {"bare_step_s": bare_s, "full_step_s": full_s,
            "runtime_overhead": max(0.0, 1.0 - bare_s / full_s)}


def runtime_overhead(pipeline: Pipeline, *, steps: int = 6, clock: str = "wall",
                     cache: Path = Path(".gfcr/cache")) -> dict[str, Any]:
    """Median step, bare and full, and the overhead share on ``clock`` (top-level keys),
    with both clocks' figures, the Prefect server's CPU per step and the pipeline
    measured. The warm start is shared with ``gfcr run`` through ``cache`` (trained
    there once if missing)."""
    quiet_prefect()  # as `gfcr run` runs it
    pipeline = pipeline.with_overrides([f"steps={steps}"])
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        before = _bare_steps(pipeline, cache)
        full = _full_steps(pipeline, Path(tmp), cache)
        after = _bare_steps(pipeline, cache)
    result: dict[str, Any] = {
        name: _figures(before.gaps(name) + after.gaps(name), full.gaps(name))
        for name in CLOCKS}
    result.update(result[clock])
    server = full.server_gaps()
    result["server_cpu_step_s"] = statistics.median(server) if server else None
    result["clock"] = clock
    result["pipeline"] = {"name": pipeline.name, "spec_hash": pipeline.spec_hash(),
                          "steps": steps, "stages": pipeline.to_dict()["stages"]}
    return result
