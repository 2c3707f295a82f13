"""Runtime overhead of a default step: Prefect tasks, staging, store commit, MLflow.

The default pipeline runs as ``gfcr run`` runs it (``gfcr.execute`` under Prefect, its
Prefect settings, each step committed to the store behind the next one, metrics to
MLflow) from the cached warm start. The loop times each stage's own work from inside
whatever the executor wraps around it (``time/<stage>`` metrics, ``StepReport.cpu``), so
one run splits every step in two, on each clock:

- the step: the gap between two consecutive step ends, so it includes the commit and
  the logging of the step before, wherever they ran, and a checkpoint when one is due
  (every 10 steps by default). Step 0, which pays one-off warm-up, and the last step,
  whose checkpoint and final batch of metrics are the run's end, are left out;
- the stages' own work in it; the rest is the runtime's.

``overhead = 1 - stages / steps``, summed over the steps measured, so a cost paid every
few steps (a checkpoint) counts at its rate. Measured in one run it needs no
baseline run, whose own step-to-step variation (a bare step's median moved by 20%
between runs here) swamped a 5% difference. Two clocks: ``wall`` (the step's time, what
a user waits: background work on a spare core costs it nothing) and ``process`` (CPU
seconds of this process, all threads: work moved to a background thread counts in full;
a stage's CPU is its thread's plus its helpers' (gfcr.procs.helper); torch runs one thread).

What the stage clock cannot see is the runtime slowing the stages down (the GIL, caches).
A *bare* run of the same steps (the loop called in-process: no Prefect, store or MLflow)
looks for that: ``work_inflation`` = the stages' median CPU in the full run over the bare
one's, minus one. It compares two runs, so it carries the run-to-run variation above
(-5% to +21% over five runs here, centred near zero): a check, not a correction. Where the runtime's CPU goes, by thread (Linux, from /proc), is in
``threads``. The temporary Prefect server is another process: its CPU per step is
reported apart (``server_cpu_step_s``), in neither figure.
"""

from __future__ import annotations

import os
import re
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

from gfcr.cli import quiet_prefect
from gfcr.core.pipeline import Pipeline
from gfcr.launch.run import MemoryStash, execute
from gfcr.runner.inprocess import local_services
from gfcr.runner.loop import Runtime, run_step

CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter,
                                          "process": time.process_time}


def _stat(path: Path) -> tuple[int, float]:
    """(parent pid, CPU seconds) from a /proc ``stat`` file."""
    fields = path.read_text().rsplit(")", 1)[1].split()
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


STEP_THREADS = "step thread and its helpers"
"""The main thread, which runs the loop and the stages, and the helper threads stages
hand calls to (gfcr.procs.helper), whose CPU the stage clock charges to the stage."""


def thread_cpu() -> dict[str, float]:
    """CPU seconds of this process's live threads by name, pools' workers summed under
    the pool's name ({} where /proc is missing). 10-ms ticks: sum over steps."""
    if not os.path.isdir("/proc/self/task"):
        return {}
    names = {t.native_id: t.name for t in threading.enumerate()}
    names[threading.main_thread().native_id] = STEP_THREADS
    out: dict[str, float] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            _, cpu = _stat(Path(f"/proc/self/task/{tid}/stat"))
        except OSError:
            continue
        name = re.sub(r"[-_]\d+$", "", names.get(int(tid), "other (not Python)"))
        name = STEP_THREADS if name == "gfcr-helper" else name
        out[name] = out.get(name, 0.0) + cpu
    return out


def children_cpu() -> float | None:
    """CPU seconds of this process's live descendants (the Prefect server), from /proc;
    None where /proc is missing."""
    if not os.path.isdir("/proc"):
        return None
    parents, cpu = {}, {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                parents[int(entry)], cpu[int(entry)] = _stat(Path(f"/proc/{entry}/stat"))
            except OSError:
                continue
    tree, grew = {os.getpid()}, True
    while grew:
        grew = False
        for pid, parent in parents.items():
            if parent in tree and pid not in tree:
                tree.add(pid)
                grew = True
    return sum(cpu[pid] for pid in tree - {os.getpid()})


class _Steps:
    """A run hook: at each step end, the clocks, the stages' own time, the threads' CPU
    and the Prefect server's CPU. Reading /proc takes a few ms of this thread: that time
    (``spent``) is taken off the next step's gap, so measuring does not count as
    overhead."""

    def __init__(self) -> None:
        self.marks: list[dict[str, Any]] = []

    def on_step(self, *, metrics: dict[str, float], cpu: dict[str, float], **_: Any) -> None:
        mark = {name: clock() for name, clock in CLOCKS.items()}
        mark.update({
            "stages": {"wall": sum(v for k, v in metrics.items() if k.startswith("time/")),
                       "process": sum(cpu.values())},
            "threads": thread_cpu(), "server": children_cpu()})
        mark["spent"] = {name: clock() - mark[name] for name, clock in CLOCKS.items()}
        self.marks.append(mark)

    @staticmethod
    def _gap(a: dict[str, Any], b: dict[str, Any], clock: str) -> float:
        return b[clock] - a[clock] - a["spent"][clock]

    def _window(self) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        """(end of step k-1, end of step k) for the steps measured: 1 to the last but one."""
        return list(zip(self.marks[:-2], self.marks[1:-1]))

    def overhead(self, clock: str) -> dict[str, float]:
        """The overhead share on ``clock`` over the steps measured, and the median step,
        stage work and per-step share."""
        pairs = self._window()
        steps = [self._gap(a, b, clock) for a, b in pairs]
        work = [b["stages"][clock] for _, b in pairs]
        return {"runtime_overhead": 1.0 - sum(work) / sum(steps),
                "step_s": statistics.median(steps), "stages_s": statistics.median(work),
                "median_step_overhead": statistics.median(1.0 - w / s
                                                          for w, s in zip(work, steps))}

    def threads(self) -> dict[str, float]:
        """The runtime's CPU seconds a step by thread (mean over steps): each thread's
        CPU, less the stages' own on the step's threads. Linux keeps threads' times in
        ticks and scales them apart from the process's: ``unattributed`` (the process's
        CPU less the threads', a few percent of a step either way) is that error, plus
        threads that ended between two step ends."""
        pairs = self._window()
        if not pairs or not pairs[0][1]["threads"]:
            return {}
        out: dict[str, float] = {}
        for a, b in pairs:
            gaps = {k: v - a["threads"].get(k, 0.0) for k, v in b["threads"].items()}
            gaps[STEP_THREADS] -= b["stages"]["process"] + a["spent"]["process"]
            gaps["unattributed"] = (self._gap(a, b, "process") - b["stages"]["process"]
                                    - sum(gaps.values()))
            for k, v in gaps.items():
                out[k] = out.get(k, 0.0) + v / len(pairs)
        return {k: round(v, 4) for k, v in sorted(out.items(), key=lambda kv: -kv[1])
                if abs(v) >= 0.0005}

    def server(self) -> float | None:
        cpu = [(a["server"], b["server"]) for a, b in self._window()]
        if not cpu or any(None in pair for pair in cpu):
            return None
        return statistics.median(b - a for a, b in cpu)


def _bare_stage_cpu(pipeline: Pipeline, cache: Path) -> float:
    """The stages' median CPU a step (steps 2 on), the loop called in-process."""
    policy = pipeline.policy.build(seed=pipeline.seed)
    engine = pipeline.engine.build(policy, seed=pipeline.seed)  # sets CPU threads first
    if pipeline.warmstart is not None:
        pipeline.warmstart.run(policy, pipeline.task, seed=pipeline.seed, cache_dir=cache)
    learner = pipeline.of_kind("train")[0].learner(policy, seed=pipeline.seed)
    rt = Runtime(pipeline=pipeline, task=pipeline.task,
                 services=local_services(engine, policy, learner), stash=MemoryStash())
    work = [sum(run_step(rt, "bare", step, lambda name, fn, *args: fn(*args)).cpu.values())
            for step in range(pipeline.steps)]
    return statistics.median(work[2:])


def runtime_overhead(pipeline: Pipeline, *, steps: int = 12, clock: str = "wall",
                     cache: Path = Path(".gfcr/cache")) -> dict[str, Any]:
    """The overhead share on ``clock`` (top-level ``runtime_overhead``), both clocks'
    figures, the runtime's CPU by thread, the work inflation against a bare run, the
    Prefect server's CPU per step and the pipeline measured. The warm start is shared
    with ``gfcr run`` through ``cache`` (trained there once if missing)."""
    from gfcr.tracking.mlflow_hook import MlflowHook

    quiet_prefect()  # as `gfcr run` runs it
    pipeline = pipeline.with_overrides([f"steps={steps}"])
    cache.mkdir(parents=True, exist_ok=True)
    marks = _Steps()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "cache").symlink_to(cache.resolve(), target_is_directory=True)
        execute(pipeline, root=root, executor="prefect", hooks=[marks, MlflowHook()])
    result: dict[str, Any] = {name: marks.overhead(name) for name in CLOCKS}
    result["runtime_overhead"] = result[clock]["runtime_overhead"]
    result["threads"] = marks.threads()
    full_work = result["process"]["stages_s"]
    result["work_inflation"] = full_work / _bare_stage_cpu(pipeline, cache) - 1.0
    result["server_cpu_step_s"] = marks.server()
    result["clock"] = clock
    result["pipeline"] = {"name": pipeline.name, "spec_hash": pipeline.spec_hash(),
                          "steps": steps, "stages": pipeline.to_dict()["stages"]}
    return result
