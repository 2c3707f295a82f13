"""Executors: run a pipeline as a Prefect flow (the default) or in-process (tests).

This is the only module that imports prefect. Under Prefect a pipeline run is one flow
run (named by the run id); every stage of every step is one task run named
``<stage>[step=N]``, plus ``warmstart``, ``evaluate[step=N]`` and ``commit[step=N]``.
Tasks pass :class:`~gfcr.loop.TableRef` references to Arrow files staged under the run
root; the engine, the policy and the store connection stay in the flow's process for the
whole run. Both executors run the same loop code with the same seeds, so they give the
same results.
"""

from __future__ import annotations

import os
import secrets
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal, Protocol

import pyarrow as pa
import pyarrow.ipc as ipc

from gfcr.loop import Runtime, StepReport, TableRef, evaluate, run_step
from gfcr.pipeline import Pipeline

Executor = Literal["prefect", "local"]
DEFAULT_ROOT = Path(".gfcr")


# --------------------------------------------------------------------------- stashes


class MemoryStash:
    """Tables kept in a dict; for the in-process executor."""

    def __init__(self) -> None:
        self._tables: dict[str, pa.Table] = {}

    def put(self, key: str, table: pa.Table) -> TableRef:
        self._tables[key] = table
        return TableRef(key, table.num_rows)

    def get(self, ref: TableRef) -> pa.Table:
        return self._tables[ref.key]


class FileStash:
    """Tables staged as Arrow IPC files, so task inputs and outputs are only names."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def put(self, key: str, table: pa.Table) -> TableRef:
        path = self.root / f"{key}.arrow"
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        with pa.OSFile(str(tmp), "wb") as sink, ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)
        os.replace(tmp, path)
        return TableRef(key, table.num_rows)

    def get(self, ref: TableRef) -> pa.Table:
        with pa.memory_map(str(self.root / f"{ref.key}.arrow")) as source:
            return ipc.open_file(source).read_all()


# --------------------------------------------------------------------------- hooks


class Hook(Protocol):
    """Observes a run from the orchestrating process (progress display, MLflow).

    Methods take keyword arguments only, so new ones can be added without breaking
    hooks written before them.
    """

    def on_start(self, *, run_id: str, pipeline: Pipeline, root: Path, **kw: Any) -> None: ...

    def on_phase(self, *, phase: str, **kw: Any) -> None: ...

    def on_step(self, *, step: int, metrics: dict[str, float], **kw: Any) -> None: ...

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

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


# --------------------------------------------------------------------------- running


def new_run_id(pipeline: Pipeline) -> str:
    return f"{pipeline.name}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


def execute(pipeline: Pipeline, *, root: Path = DEFAULT_ROOT, executor: Executor = "prefect",
            run_id: str | None = None, hooks: list[Any] | None = None,
            store: Any = None) -> RunSummary:
    """Run ``pipeline`` to completion and return its summary.

    ``store`` is an open RolloutStore (None: open the one under ``root``).
    """
    from store import RolloutStore

    root = Path(root).resolve()
    run_id = run_id or new_run_id(pipeline)
    hooks = list(hooks or [])
    own_store = store is None
    store = store or RolloutStore.open(root / "store")
    stash: Any = FileStash(root / "staging" / run_id) if executor == "prefect" else MemoryStash()
    try:
        body = _body(pipeline, root, run_id, hooks, store, stash)
        if executor == "local":
            return body(_local_call)
        return _prefect_flow(pipeline, run_id, body)
    finally:
        if isinstance(stash, FileStash):
            shutil.rmtree(stash.root, ignore_errors=True)
        if own_store:
            store.close()


def _local_call(name: str, fn: Callable[..., Any], *args: Any) -> Any:
    return fn(*args)


def _body(pipeline: Pipeline, root: Path, run_id: str, hooks: list[Any], store: Any,
          stash: Any) -> Callable[[Callable[..., Any]], RunSummary]:
    def body(call: Callable[..., Any]) -> RunSummary:
        started = time.perf_counter()
        store.start_run(run_id, pipeline=pipeline.name, spec_yaml=pipeline.to_yaml(),
                        spec_hash=pipeline.spec_hash(), code_version=_code_version())
        _emit(hooks, "on_start", run_id=run_id, pipeline=pipeline, root=root)
        status = "failed"
        try:
            summary = _drive(pipeline, root, run_id, hooks, store, stash, call, started)
            status = "finished"
            return summary
        finally:
            store.finish_run(run_id, status)
            if status != "finished":
                _emit(hooks, "on_end", summary=None, status=status)
    return body


def _drive(pipeline: Pipeline, root: Path, run_id: str, hooks: list[Any], store: Any,
           stash: Any, call: Callable[..., Any], started: float) -> RunSummary:
    rt, policy = _build(pipeline, run_id, stash, store)
    heldout = pipeline.task.heldout_prompts().slice(0, pipeline.evaluation.size)
    ev = pipeline.evaluation

    def evaluate_at(label: str, step: int) -> float:
        _emit(hooks, "on_phase", phase=f"evaluate[{label}]")
        result = call(f"evaluate[{label}]",
                      lambda: evaluate(rt.task, rt.engine, heldout, max_tokens=ev.max_tokens))
        _emit(hooks, "on_eval", step=step, accuracy=result["accuracy"], label=label)
        return result["accuracy"]

    before = warmed = None
    warm: dict[str, float] = {}
    if pipeline.warmstart is not None:
        before = evaluate_at("initial", 0)
        _emit(hooks, "on_phase", phase="warmstart")
        warm = dict(call("warmstart", lambda: pipeline.warmstart.run(
            policy, pipeline.task, seed=pipeline.seed, cache_dir=root / "cache")))
        rt.engine.update_weights()
    warmed = evaluate_at("step=0", 0)
    history: list[dict[str, float]] = []
    for step in range(pipeline.steps):
        report: StepReport = run_step(rt, run_id, step, call)
        if ev.every and (step + 1) % ev.every == 0 and step + 1 < pipeline.steps:
            report.metrics["heldout_accuracy"] = evaluate_at(f"step={step + 1}", step + 1)
        history.append(report.metrics)
        _emit(hooks, "on_step", step=step, metrics=report.metrics)
    after = evaluate_at(f"step={pipeline.steps}", pipeline.steps)
    summary = RunSummary(
        run_id=run_id, pipeline=pipeline.name, spec_hash=pipeline.spec_hash(),
        store=str(store.uri), mlflow=None, steps=pipeline.steps,
        rollouts=int(store.sql("SELECT count(*) AS n FROM rollouts WHERE run_id = ?",
                               [run_id]).column("n")[0].as_py()),
        accuracy_before=warmed if before is None else before,
        accuracy_warmstart=warmed if before is not None else None, accuracy_after=after,
        seconds=time.perf_counter() - started, warmstart=warm, history=history)
    _emit(hooks, "on_end", summary=summary, status="finished")
    return summary


def _build(pipeline: Pipeline, run_id: str, stash: Any, store: Any) -> tuple[Runtime, Any]:
    """Policy, engine and learner: built once, kept for the whole run."""
    policy = pipeline.policy.build(seed=pipeline.seed)
    engine = pipeline.engine.build(policy, seed=pipeline.seed)
    trainers = pipeline.of_kind("train")
    learner = trainers[0].learner(policy, seed=pipeline.seed) if trainers else None
    rt = Runtime(pipeline=pipeline, task=pipeline.task, engine=engine, learner=learner,
                 stash=stash, commit=store.commit_step, history=_history(store, run_id))
    return rt, policy


def _history(store: Any, run_id: str) -> Callable[[int], Any]:
    """The run's history as of the step before ``step``: what a resumed run sees too."""
    from store import History

    def at(step: int) -> Any:
        return History(store, run_id, as_of_step=step - 1) if step else History(store, run_id)
    return at


def _code_version() -> str:
    from importlib.metadata import version

    return f"gfcr {version('gfcr')}"


# --------------------------------------------------------------------------- prefect


def _prefect_flow(pipeline: Pipeline, run_id: str,
                  body: Callable[[Callable[..., Any]], RunSummary]) -> RunSummary:
    from prefect import flow

    kinds = {s.label: s.kind for s in pipeline.stages}

    def call(name: str, fn: Callable[..., Any], *args: Any) -> Any:
        return _prefect_task(name, fn, kinds.get(name.split("[", 1)[0]))(*args)

    def gfcr_run() -> RunSummary:
        return body(call)

    return flow(gfcr_run, name=pipeline.name, flow_run_name=run_id,
                validate_parameters=False, persist_result=False, log_prints=False)()


def _prefect_task(name: str, fn: Callable[..., Any], kind: str | None) -> Any:
    from prefect import task
    from prefect.cache_policies import NO_CACHE

    retries = 2 if kind in ("generate", "filter") else 0
    return task(fn, name=name, task_run_name=name, retries=retries, retry_delay_seconds=1,
                cache_policy=NO_CACHE, persist_result=False)
