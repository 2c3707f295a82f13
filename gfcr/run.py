"""Executors: run a pipeline as a Prefect flow (the default) or in-process (tests).

This is the only module that imports prefect. Under Prefect a pipeline run is one flow
run (named by the run id); every stage of every step is one task run named
``<stage>[step=N]``, plus ``warmstart``, ``evaluate[step=N]`` and ``commit[step=N]``.
Tasks pass :class:`~gfcr.loop.TableRef` references to tables that stay in the flow's
process (:mod:`gfcr.stash`: in memory, spilled to Arrow files past a budget); the engine,
the policy and the store connection stay there for the whole run too. A step's commit
runs behind the next step, in order, finished before that step's history is read, before
each checkpoint and before the run ends (:mod:`gfcr.commits`). Both executors run the
same loop code with the same seeds, so they give the same results.

A run id the store already holds is continued, not restarted: from its newest checkpoint,
replaying committed steps after it without committing them again (:mod:`gfcr.resume`).
Checkpoints are written after every ``checkpoint.every`` steps and after the last, as the
task ``checkpoint[step=N]`` (:mod:`gfcr.checkpoint`).
"""

from __future__ import annotations

import re
import secrets
import shutil
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Literal, Protocol

from gfcr import checkpoint, resume
from gfcr.commits import BackgroundCommits, LazyHistory, Start
from gfcr.loop import Runtime, StepReport, evaluate, run_step
from gfcr.pipeline import Pipeline
from gfcr.stash import FileStash, MemoryStash, SpillStash  # noqa: F401 (imported from here)

Executor = Literal["prefect", "local"]
DEFAULT_ROOT = Path(".gfcr")


# --------------------------------------------------------------------------- hooks


class Hook(Protocol):
    """Observes a run from the orchestrating process (progress display, MLflow).

    Methods take keyword arguments only, so new ones can be added without breaking
    hooks written before them.
    """

    def on_start(self, *, run_id: str, pipeline: Pipeline, root: Path, resumed: bool,
                 store: Any, **kw: Any) -> None:
        """``resumed``: the run id is an existing run, which this call continues;
        ``store``: the run's open RolloutStore."""

    def on_resume(self, *, step: int, path: Path, **kw: Any) -> None:
        """A resumed run loaded the checkpoint after ``step`` from ``path``."""

    def on_phase(self, *, phase: str, **kw: Any) -> None: ...

    def on_step(self, *, step: int, metrics: dict[str, float], replayed: bool,
                cpu: dict[str, float], **kw: Any) -> None:
        """``replayed``: a step of a resumed run that was committed before (see
        gfcr.resume); its metrics were reported when it first ran. ``cpu``: each stage's
        CPU seconds (gfcr.loop.StepReport.cpu); its wall seconds are ``time/<stage>``
        metrics."""

    def on_eval(self, *, step: int, accuracy: float, **kw: Any) -> None: ...

    def on_end(self, *, summary: "RunSummary", status: str, **kw: Any) -> None: ...


def _emit(hooks: list[Any], method: str, **kw: Any) -> None:
    for hook in hooks:
        fn = getattr(hook, method, None)
        if fn is not None:
            fn(**kw)


# --------------------------------------------------------------------------- summary


@dataclass
class RunSummary:
    """The outcome of a run, as ``gfcr run`` prints it."""

    run_id: str
    pipeline: str
    spec_hash: str
    store: str
    mlflow: str | None
    steps: int
    rollouts: int
    accuracy_before: float
    """Held-out accuracy at the start of the run, before any training (warm start too)."""
    accuracy_warmstart: float | None
    """After the warm start, before the first step (None without a warm start)."""
    accuracy_after: float
    seconds: float
    warmstart: dict[str, float] = field(default_factory=dict)
    history: list[dict[str, float]] = field(default_factory=list)
    resumed_from: int | None = None
    """The checkpoint step this call resumed from (None: not resumed from a checkpoint)."""

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


# --------------------------------------------------------------------------- running


def new_run_id(pipeline: Pipeline) -> str:
    return f"{pipeline.name}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def execute(pipeline: Pipeline, *, root: Path = DEFAULT_ROOT, executor: Executor = "prefect",
            run_id: str | None = None, hooks: list[Any] | None = None,
            store: Any = None) -> RunSummary:
    """Run ``pipeline`` to completion and return its summary.

    ``run_id`` names the run (None: a new id from the pipeline name and the time). The id
    of a run the store already holds resumes that run from its newest checkpoint (see
    :mod:`gfcr.resume`); the pipeline must then be that run's own, up to ``steps`` and
    ``checkpoint``, or :class:`gfcr.resume.ResumeError` is raised before anything is
    written. ``store`` is an open RolloutStore (None: open the one under ``root``).
    """
    from store import RolloutStore

    root = Path(root).resolve()
    if run_id is not None and not _RUN_ID.fullmatch(run_id):
        raise ValueError(f"run id {run_id!r} may hold only letters, digits, '.', '_' and '-' "
                         "(it names folders under the run root), starting with a letter or digit")
    run_id = run_id or new_run_id(pipeline)
    hooks = list(hooks or [])
    own_store = store is None
    store = store or RolloutStore.open(root / "store")
    stash = SpillStash(root / "staging" / run_id)
    try:
        resumed = resume.check(store, run_id, pipeline)
        body = _body(pipeline, root, run_id, hooks, store, stash, resumed)
        if executor == "local":
            return _local(body)
        return _prefect_flow(pipeline, run_id, body)
    finally:
        shutil.rmtree(stash.root, ignore_errors=True)
        if own_store:
            store.close()


def _local(body: Callable[[Callable[..., Any], Start], RunSummary]) -> RunSummary:
    """The in-process executor: plain calls, background commits in one thread."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1, thread_name_prefix="gfcr-commit") as pool:
        return body(lambda name, fn, *args: fn(*args),
                    lambda name, fn, *args: pool.submit(fn, *args))


def _body(pipeline: Pipeline, root: Path, run_id: str, hooks: list[Any], store: Any,
          stash: Any, resumed: bool) -> Callable[[Callable[..., Any], Start], RunSummary]:
    def body(call: Callable[..., Any], start: Start) -> RunSummary:
        started = time.perf_counter()
        store.start_run(run_id, pipeline=pipeline.name, spec_yaml=pipeline.to_yaml(),
                        spec_hash=pipeline.spec_hash(), code_version=_code_version())
        _emit(hooks, "on_start", run_id=run_id, pipeline=pipeline, root=root, resumed=resumed,
              store=store)
        status, commits = "failed", BackgroundCommits(start)
        try:
            rt, policy = _build(pipeline, run_id, stash, store, commits)
            summary = _drive(_Run(pipeline, root, run_id, hooks, store, call, rt, policy,
                                  commits), started, resumed)
            status = "finished"
            return summary
        finally:
            try:
                commits.wait()  # a commit in flight finishes, whatever else failed
            finally:
                store.finish_run(run_id, status)
                if status != "finished":
                    _emit(hooks, "on_end", summary=None, status=status)
    return body


@dataclass
class _Run:
    """What the driving functions share: the run, its live objects and its executor."""

    pipeline: Pipeline
    root: Path
    run_id: str
    hooks: list[Any]
    store: Any
    call: Callable[..., Any]
    rt: Runtime
    policy: Any
    commits: BackgroundCommits

    def evaluate_at(self, label: str, step: int) -> float:
        """Held-out greedy accuracy, as the task ``evaluate[label]``."""
        ev, rt = self.pipeline.evaluation, self.rt
        heldout = self.pipeline.task.heldout_prompts().slice(0, ev.size)
        _emit(self.hooks, "on_phase", phase=f"evaluate[{label}]")
        result = self.call(f"evaluate[{label}]", lambda: evaluate(
            rt.task, rt.engine, heldout, max_tokens=ev.max_tokens))
        _emit(self.hooks, "on_eval", step=step, accuracy=result["accuracy"], label=label)
        return result["accuracy"]


def _drive(run: _Run, started: float, resumed: bool) -> RunSummary:
    """Start (or resume), run the remaining steps, evaluate, summarise."""
    p, store = run.pipeline, run.store
    ckpt = checkpoint.latest(checkpoint.directory(run.root, run.run_id)) if resumed else None
    if ckpt is None:
        progress = _start(run)
    else:
        progress = checkpoint.restore(ckpt, policy=run.policy, learner=run.rt.learner,
                                      engine=run.rt.engine)
        _emit(run.hooks, "on_resume", step=ckpt.step, path=ckpt.path)
    last = store.last_step(run.run_id) if resumed else None
    for step in range(0 if ckpt is None else ckpt.step + 1, p.steps):
        _step(run, step, progress, replayed=last is not None and step <= last)
    after = run.evaluate_at(f"step={p.steps}", p.steps)
    run.commits.wait()
    initial, start = progress["accuracy_initial"], progress["accuracy_start"]
    summary = RunSummary(
        run_id=run.run_id, pipeline=p.name, spec_hash=p.spec_hash(), store=str(store.uri),
        mlflow=None, steps=p.steps,
        rollouts=int(store.sql("SELECT count(*) AS n FROM rollouts WHERE run_id = ?",
                               [run.run_id]).column("n")[0].as_py()),
        accuracy_before=start if initial is None else initial,
        accuracy_warmstart=None if initial is None else start, accuracy_after=after,
        seconds=time.perf_counter() - started, warmstart=progress["warmstart"],
        history=progress["history"], resumed_from=None if ckpt is None else ckpt.step)
    _emit(run.hooks, "on_end", summary=summary, status="finished")
    return summary


def _start(run: _Run) -> dict[str, Any]:
    """A run's beginning: evaluate, warm start, evaluate again. Returns the progress
    record that checkpoints carry (see gfcr.checkpoint)."""
    p = run.pipeline
    progress: dict[str, Any] = {"accuracy_initial": None, "accuracy_start": None,
                                "warmstart": {}, "history": []}
    if p.warmstart is not None:
        progress["accuracy_initial"] = run.evaluate_at("initial", 0)
        _emit(run.hooks, "on_phase", phase="warmstart")
        progress["warmstart"] = dict(run.call("warmstart", lambda: p.warmstart.run(
            run.policy, p.task, seed=p.seed, cache_dir=run.root / "cache")))
        run.rt.engine.update_weights()
    progress["accuracy_start"] = run.evaluate_at("step=0", 0)
    return progress


def _step(run: _Run, step: int, progress: dict[str, Any], *, replayed: bool) -> None:
    """One step, then a checkpoint when one is due. A replayed step (committed before a
    resume) runs without committing and is checked against the store instead."""
    p, ev = run.pipeline, run.pipeline.evaluation
    report: StepReport = run_step(replace(run.rt, commit=None) if replayed else run.rt,
                                  run.run_id, step, run.call)
    if replayed:
        table = run.rt.stash.get(report.rollouts)
        report.metrics["resume/replay_mismatch"] = float(
            resume.replay_mismatch(run.store, run.run_id, step, table))
    elif ev.every and (step + 1) % ev.every == 0 and step + 1 < p.steps:
        report.metrics["heldout_accuracy"] = run.evaluate_at(f"step={step + 1}", step + 1)
    progress["history"].append(report.metrics)
    # step - 1's commit is done: this step handed its own over only after it (or, a
    # replayed step, came before any commit of this call)
    run.rt.stash.forget(f"{step - 1}/")
    every = p.checkpoint.every
    if step == p.steps - 1 or (every and (step + 1) % every == 0):
        run.commits.wait()  # a checkpoint follows its step's commit (gfcr.resume)
        run.call(f"checkpoint[step={step}]", lambda: str(checkpoint.save(
            checkpoint.directory(run.root, run.run_id), run_id=run.run_id, step=step,
            spec_hash=p.spec_hash(), policy=run.policy, learner=run.rt.learner,
            engine=run.rt.engine, progress=progress, keep=p.checkpoint.keep).path))
    _emit(run.hooks, "on_step", step=step, metrics=report.metrics, replayed=replayed,
          cpu=report.cpu)


def _build(pipeline: Pipeline, run_id: str, stash: Any, store: Any,
           commits: BackgroundCommits) -> tuple[Runtime, Any]:
    """Policy, engine and learner: built once, kept for the whole run."""
    policy = pipeline.policy.build(seed=pipeline.seed)
    engine = pipeline.engine.build(policy, seed=pipeline.seed)
    trainers = pipeline.of_kind("train")
    learner = trainers[0].learner(policy, seed=pipeline.seed) if trainers else None
    snapshots: dict[int, int] = {}
    rt = Runtime(pipeline=pipeline, task=pipeline.task, engine=engine, learner=learner,
                 stash=stash, commit=_recording(store.commit_step, snapshots),
                 history=_history(store, run_id, snapshots, commits), background=commits)
    return rt, policy


def _recording(commit: Callable[..., Any], snapshots: dict[int, int]) -> Callable[..., Any]:
    """``commit`` that notes each step's snapshot, so the next step's history is pinned
    without searching the store's snapshot list (a query that grows with the run)."""
    def commit_step(run_id: str, step: int, rollouts: Any, **kw: Any) -> Any:
        result = commit(run_id, step, rollouts, **kw)
        if result.snapshot is not None:
            snapshots[step] = result.snapshot
        return result
    return commit_step


def _history(store: Any, run_id: str, snapshots: dict[int, int],
             commits: BackgroundCommits) -> Callable[[int], Any]:
    """The run's history as of the step before ``step``: what a resumed run sees too. At
    step 0 that is the store before the run's first commit (live, until it has one).
    Built when a stage first reads it, after the commit running behind the step."""
    from store import History

    def at(step: int) -> Any:
        commits.wait()
        if step and step - 1 in snapshots:
            return History(store, run_id, as_of_snapshot=snapshots[step - 1])
        if step:
            return History(store, run_id, as_of_step=step - 1)
        first = store.step_snapshot(run_id, 0)
        return History(store, run_id, as_of_snapshot=None if first is None else first - 1)
    return lambda step: LazyHistory(lambda: at(step))


def _code_version() -> str:
    from importlib.metadata import version

    return f"gfcr {version('gfcr')}"


# --------------------------------------------------------------------------- prefect


def _prefect_flow(pipeline: Pipeline, run_id: str,
                  body: Callable[[Callable[..., Any], Start], RunSummary]) -> RunSummary:
    from prefect import flow

    tasks = _tasks(pipeline)

    def call(name: str, fn: Callable[..., Any], *args: Any) -> Any:
        return tasks(name)(name=name, fn=fn, args=args)

    def start(name: str, fn: Callable[..., Any], *args: Any) -> Any:
        return tasks(name).submit(name=name, fn=fn, args=args)  # the flow's thread pool

    def gfcr_run() -> RunSummary:
        return body(call, start)

    return flow(gfcr_run, name=pipeline.name, flow_run_name=run_id,
                validate_parameters=False, persist_result=False, log_prints=False)()


def _tasks(pipeline: Pipeline) -> Callable[[str], Any]:
    """``tasks(name)``: the Prefect task for a call named ``<stage>[...]``, one per stage
    (or ``commit``, ``evaluate``, ...), built on first use and reused by every step:
    building a task reads and hashes its function's source (about 2 ms a time). Each call
    is still its own task run, named ``name``."""
    from prefect import task
    from prefect.cache_policies import NO_CACHE

    kinds = {s.label: s.kind for s in pipeline.stages}
    built: dict[str, Any] = {}

    def get(name: str) -> Any:
        label = name.split("[", 1)[0]
        if label not in built:
            retries = 2 if kinds.get(label) in ("generate", "filter") else 0
            built[label] = task(_invoke, name=label, task_run_name="{name}", retries=retries,
                                retry_delay_seconds=1, cache_policy=NO_CACHE,
                                persist_result=False)
        return built[label]
    return get


def _invoke(name: str, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    """What every task runs: the loop's call ``fn(*args)`` (``name`` names the run)."""
    return fn(*args)
