"""Running a pipeline: ``execute`` starts (or resumes) a run and drives it step by step.

The run's stage calls go through an executor (:mod:`gfcr.transport.executors`: Prefect tasks by
default, or plain in-process calls); both run the same loop code with the same seeds, so
they give the same results. Tables stay in the orchestrating process (:mod:`gfcr.transport.stash`:
in memory, spilled to Arrow files past a budget); the engine, the policy and the store
connection stay there for the whole run too. A step's commit runs behind the next step,
in order, finished before that step's history is read, before each checkpoint and before
the run ends (:mod:`gfcr.runner.commits`).

A run id the store already holds is continued, not restarted: from its newest checkpoint,
replaying committed steps after it without committing them again (:mod:`gfcr.checkpoints.resume`).
Checkpoints are written after every ``checkpoint.every`` steps and after the last
(:mod:`gfcr.checkpoints.checkpoint`). A stop request (:mod:`gfcr.checkpoints.cancel`) ends the run at the next
step boundary, checkpointed, with the store's status ``cancelled``.
"""

from __future__ import annotations

import secrets
import shutil
import time
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any, Callable, Sequence

import pyarrow as pa

from gfcr.core import names, storage
from gfcr.evaluation.columns import HELDOUT
from gfcr.core.policy import Policy
from gfcr.core.pipeline import Pipeline
from gfcr.core.services import AdapterLearner
from gfcr.core.stage import Task
from gfcr.launch.build import build
from gfcr.launch.hooks import RunSummary, emit
from gfcr.launch.ledger import RunLedger, code_version, open_ledger, reason
from gfcr.launch.placement import Placement, explicit, refuse_generate_pool, settle
from gfcr.report.publish import end_of_run_page
from gfcr.runner import rounds
from gfcr.checkpoints import checkpoint, resume
from gfcr.checkpoints.cancel import RunCancelled, Stop, cancelled
from gfcr.runner.commits import BackgroundCommits, Start
from gfcr.runner.loop import Runtime, StepReport, run_step
from gfcr.runner.runtime import Stash
from gfcr.transport.stash import FileStash, MemoryStash, SpillStash  # noqa: F401 (imported from here)
from gfcr.transport import prefect_crash
from gfcr.transport.executors import Call, Executor, PrefectExecutor, named
from gfcr.transport.progress import PrefectMilestones

DEFAULT_ROOT = Path(".gfcr")
Progress = dict[str, Any]
"""The progress record a run keeps and its checkpoints carry (gfcr.checkpoints.checkpoint):
accuracies, the warm start's figures, each step's metrics."""


# --------------------------------------------------------------------------- running


def new_run_id(pipeline: Pipeline) -> str:
    return f"{pipeline.name}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


def execute(pipeline: Pipeline, *, root: Path = DEFAULT_ROOT,
            executor: Executor | str = "prefect", run_id: str | None = None,
            hooks: Sequence[object] = (), store: RunLedger | None = None,
            stop: Stop | None = None, placement: Placement | None = None,
            generate_pool: object = None) -> RunSummary:
    """Run ``pipeline`` to completion and return its summary.

    ``run_id`` names the run (None: a new id from the pipeline name and the time). The id
    of a run the store already holds resumes that run from its newest checkpoint (see
    :mod:`gfcr.checkpoints.resume`); the pipeline must then be that run's own, up to ``steps`` and
    ``checkpoint``, or :class:`gfcr.checkpoints.resume.ResumeError` is raised before anything is
    written. ``store`` is an open RolloutStore (None: the one under ``root``); ``executor``
    an :class:`~gfcr.transport.executors.Executor` or its name ("prefect", "local"). When ``stop``
    is requested the run ends at the next step boundary and raises RunCancelled.
    ``placement`` says where the generator, learner and scorer run (a fleet of vLLM
    servers, sharded ranks, a score pool; None: this process), settled with the
    pipeline's own ``learner`` by the rule of :mod:`gfcr.launch.placement` (a conflict
    raises PlacementConflict before anything runs). ``generate_pool`` (the engine-worker
    generate path, removed in issue 24) raises GeneratePoolRemoved, naming the fleet.
    """
    refuse_generate_pool(generate_pool)
    sources = [] if placement is None else [("execute(placement=...)", explicit(placement))]
    pipeline, settled = settle(pipeline, sources)
    return run_settled(pipeline, settled, root=root, executor=executor, run_id=run_id,
                       hooks=hooks, store=store, stop=stop)


def run_settled(pipeline: Pipeline, placement: Placement, *, root: Path = DEFAULT_ROOT,
                executor: Executor | str = "prefect", run_id: str | None = None,
                hooks: Sequence[object] = (), store: RunLedger | None = None,
                stop: Stop | None = None) -> RunSummary:
    """:func:`execute` of a pipeline whose ``placement`` is already settled with it
    (gfcr.launch.request.resolve does it once for a request)."""
    lake = storage.backend()
    root = Path(root).resolve()
    if run_id is not None:
        names.check_run_id(run_id)
    run_id = run_id or new_run_id(pipeline)
    chosen = named(executor) if isinstance(executor, str) else executor
    hooks = [*hooks, *([PrefectMilestones()] if isinstance(chosen, PrefectExecutor) else [])]
    own_store = store is None
    store = store or open_ledger(root / "store")
    try:
        with lake.hold(store, run_id) as lease:  # one owner per run id, before any write
            prefect_crash.after_takeover(run_id, lease)
            stash = SpillStash(root / "staging" / run_id)
            try:
                resumed = resume.check(store, run_id, pipeline)
                body = _body(pipeline, placement, root, run_id, hooks, store, stash,
                             resumed, stop or Stop(), lease.check)
                retried = {s.label for s in pipeline.stages if s.kind in ("generate", "filter")}
                return chosen.run(body, run_id=run_id, retried=retried)
            finally:
                shutil.rmtree(stash.root, ignore_errors=True)
    finally:
        if own_store:
            store.close()


def _body(pipeline: Pipeline, placement: Placement, root: Path, run_id: str,
          hooks: list[object], store: RunLedger, stash: Stash, resumed: bool, stop: Stop,
          owned: Callable[[], None]) -> Callable[[Call, Start], RunSummary]:
    def body(call: Call, start: Start) -> RunSummary:
        started = time.perf_counter()
        store.start_run(run_id, pipeline=pipeline.name, spec_yaml=pipeline.to_yaml(),
                        spec_hash=pipeline.spec_hash(), code_version=code_version())
        emit(hooks, "on_start", run_id=run_id, pipeline=pipeline, root=root, resumed=resumed,
              store=store)
        status, commits, error, rt = "failed", BackgroundCommits(start), None, None
        try:
            emit(hooks, "on_phase", phase="building the policy and the task")
            warn = lambda m: emit(hooks, "on_warning", message=m, count=1)  # noqa: E731
            rt, policy = build(pipeline, placement, run_id, root, stash, store, commits,
                               warn)
            summary = _drive(_Run(pipeline, root, run_id, hooks, store, call, rt, policy,
                                  commits, stop, owned), started, resumed)
            status = "finished"
            return summary
        except (RunCancelled, KeyboardInterrupt) as exc:
            status, error = "cancelled", reason(exc)
            raise
        except BaseException as exc:
            error = reason(exc)
            if stop.at_once:  # interrupted code raised its own error for our KeyboardInterrupt
                status = "cancelled"
                raise KeyboardInterrupt(f"stopped at once ({error})") from exc
            raise
        finally:
            stop.ending = True  # a second signal no longer interrupts (gfcr.checkpoints.cancel)
            try:
                commits.wait()  # a commit in flight finishes, whatever else failed
            finally:
                if rt is not None:
                    rt.services.close()
                store.finish_run(run_id, status, error)
                if status != "finished":
                    emit(hooks, "on_end", summary=None, status=status)
    return body


@dataclass
class _Run:
    """What the driving functions share: the run, its live objects and its executor."""

    pipeline: Pipeline
    root: Path
    run_id: str
    hooks: list[object]
    store: RunLedger
    call: Call
    rt: Runtime
    policy: Policy
    commits: BackgroundCommits
    stop: Stop
    owned: Callable[[], None]
    """Raises unless this process still holds the run's lease: called before each step,
    checkpoint and end-of-run write (the store checks it before its own writes)."""

    def evaluate_at(self, label: str, step: int, *, sets_only: bool = False) -> float:
        """Held-out greedy accuracy (and the sampled evaluation, when set), as the task
        ``evaluate[label]``, and every evaluation set due at ``step`` (all at the start
        and the end); stored in ``evaluations`` and ``eval_completions``. Returns the
        held-out accuracy (nan with ``sets_only``: the held-out split is not due)."""
        ev, accuracy = self.pipeline.evaluation, float("nan")
        if not sets_only:
            heldout = self.pipeline.task.heldout_prompts().slice(0, ev.size)
            accuracy = self._evaluate(HELDOUT, self.rt.task, heldout, label, step)
        ends = label in ("initial", "step=0", f"step={self.pipeline.steps}")
        for s in ev.sets:
            if ends or (s.every and step % s.every == 0):
                prompts = pa.concat_tables([s.task.train_prompts(), s.task.heldout_prompts()])
                self._evaluate(s.name, s.task, prompts.slice(0, s.size), label, step)
        return accuracy

    def _evaluate(self, eval_set: str, task: Task, prompts: pa.Table, label: str,
                  step: int) -> float:
        ev, rt = self.pipeline.evaluation, self.rt
        name = f"evaluate[{label}]" if eval_set == HELDOUT else f"evaluate[{eval_set}:{label}]"
        emit(self.hooks, "on_phase", phase=name)
        result = self.call(name, lambda: rt.services.generator.evaluate(
            task, prompts, handle=rt.services.learner.handle(), max_tokens=ev.max_tokens,
            progress=self.progress(name), sampled=ev.sampled, seed=self.pipeline.seed))
        for message, count in result["errors"]:
            emit(self.hooks, "on_warning", count=count,
                  message=f"{name}: the task's scorer raised (scored as wrong): {message}")
        sampled = None if ev.sampled is None else {
            "samples": ev.sampled.samples, "temperature": ev.sampled.temperature,
            "mean_reward": result["mean_reward"], "pass_at": result["pass_at"]}
        self.store.record_evaluation(self.run_id, step, label, accuracy=result["accuracy"],
                                     n_prompts=int(result["n"]), temperature=0.0,
                                     max_tokens=ev.max_tokens, eval_set=eval_set,
                                     sampled=sampled, completions=result["completions"])
        figures = {"accuracy": result["accuracy"]}
        if sampled is not None:
            figures["mean_reward"] = result["mean_reward"]
            figures.update({f"pass_at_{k}": v for k, v in result["pass_at"].items()})
        emit(self.hooks, "on_eval", step=step, accuracy=result["accuracy"], label=label,
             eval_set=eval_set, metrics=figures)
        return float(result["accuracy"])

    def progress(self, phase: str) -> Callable[[int, int], None]:
        """``progress(done, total)`` of ``phase``, for the hooks (gfcr.transport.progress)."""
        return lambda done, total: emit(self.hooks, "on_progress", phase=phase, done=done,
                                         total=total)


def _drive(run: _Run, started: float, resumed: bool) -> RunSummary:
    """Start (or resume), run the remaining steps, evaluate, summarise."""
    p, store = run.pipeline, run.store
    ckpt = checkpoint.latest(checkpoint.directory(run.root, run.run_id)) if resumed else None
    if ckpt is None:
        progress = _start(run)
    else:
        services = run.rt.services
        _rebuild_base(run)
        progress = checkpoint.restore(ckpt, policy=run.policy, learner=services.learner,
                                      engine=services.generator)
        services.generator.load(services.learner.handle())
        rounds.resume_ahead(run.rt, run.run_id, checkpoint.ahead(ckpt))
        emit(run.hooks, "on_resume", step=ckpt.step, path=ckpt.path)
    last = store.last_step(run.run_id) if resumed else None
    first = 0 if ckpt is None else ckpt.step + 1
    for step in range(first, p.steps):
        if run.stop.requested:
            _cancel(run, step - 1 if step > first else (None if ckpt is None else ckpt.step),
                    progress, saved=step == first)
        _step(run, step, progress, replayed=last is not None and step <= last)
    after = run.evaluate_at(f"step={p.steps}", p.steps)
    run.commits.wait()
    initial, start = progress["accuracy_initial"], progress["accuracy_start"]
    summary = RunSummary(
        run_id=run.run_id, pipeline=p.name, spec_hash=p.spec_hash(), store=str(store.uri),
        mlflow=None, steps=p.steps, rollouts=storage.backend().reads(store).rollout_count(run.run_id),
        accuracy_before=start if initial is None else initial,
        accuracy_warmstart=None if initial is None else start, accuracy_after=after,
        seconds=time.perf_counter() - started, warmstart=progress["warmstart"],
        history=progress["history"], resumed_from=None if ckpt is None else ckpt.step)
    run.owned()
    summary.report = end_of_run_page(store, run.run_id, run.root)
    emit(run.hooks, "on_end", summary=summary, status="finished")
    return summary


def _start(run: _Run) -> Progress:
    """A run's beginning: evaluate, warm start, evaluate again. Returns the progress
    record that checkpoints carry (see gfcr.checkpoints.checkpoint)."""
    p = run.pipeline
    progress: Progress = {"accuracy_initial": None, "accuracy_start": None,
                          "warmstart": {}, "history": []}
    if p.warmstart is not None and p.evaluation.initial:
        progress["accuracy_initial"] = run.evaluate_at("initial", 0)
    if p.warmstart is not None:
        emit(run.hooks, "on_phase", phase="warmstart")
        progress["warmstart"] = dict(run.call("warmstart", lambda: p.warmstart.run(
            run.policy, p.task, seed=p.seed, cache_dir=run.root / "cache",
            progress=run.progress("warmstart"))))
        run.rt.services.generator.load(run.rt.services.learner.publish())
    progress["accuracy_start"] = run.evaluate_at("step=0", 0)
    return progress


def _rebuild_base(run: _Run) -> None:
    """Before a resume: a learner whose checkpoints hold only an adapter (LoRA) trained it
    over the base this run built, the policy after its warm start: run the warm start
    again (from its cache) and give the generator that base; the checkpoint's adapter
    then loads on it (refused if the base differs, stages.train.lora)."""
    p, services = run.pipeline, run.rt.services
    learner = services.learner
    if p.warmstart is None or not (isinstance(learner, AdapterLearner) and
                                   learner.adapter_only):
        return
    emit(run.hooks, "on_phase", phase="warmstart")
    run.call("warmstart", lambda: p.warmstart.run(
        run.policy, p.task, seed=p.seed, cache_dir=run.root / "cache",
        progress=run.progress("warmstart")))
    services.generator.load(learner.handle())


def _step(run: _Run, step: int, progress: Progress, *, replayed: bool) -> None:
    """One step, then a checkpoint when one is due. A replayed step (committed before a
    resume) runs without committing, and trains on the rows the store holds for it
    (gfcr.checkpoints.resume.stored_batch)."""
    p, ev = run.pipeline, run.pipeline.evaluation
    run.owned()
    rt = replace(run.rt, record=run.rt.record.replaying(
        partial(resume.stored_batch, run.store, run.run_id))) if replayed else run.rt
    report: StepReport = run_step(rt, run.run_id, step, run.call)
    if not replayed and step + 1 < p.steps:
        if ev.every and (step + 1) % ev.every == 0:
            report.metrics["heldout_accuracy"] = run.evaluate_at(f"step={step + 1}", step + 1)
        elif any(s.every and (step + 1) % s.every == 0 for s in ev.sets):
            run.evaluate_at(f"step={step + 1}", step + 1, sets_only=True)
    progress["history"].append(report.metrics)
    # step - 1's commit is done: this step handed its own over only after it (or, a
    # replayed step, came before any commit of this call)
    run.rt.stash.forget(f"{step - 1}/")
    if _checkpoint_due(p, step):
        _checkpoint(run, step, progress)
    run.owned()  # no step reported to the hooks (MLflow) by a run that lost its lease
    for message, count in ([] if replayed else report.errors):
        emit(run.hooks, "on_warning", count=count,
              message=f"a scorer raised on rollouts (kept as score_error): {message}")
    emit(run.hooks, "on_step", step=step, metrics=report.metrics, replayed=replayed,
          cpu=report.cpu)


def _checkpoint_due(p: Pipeline, step: int) -> bool:
    every = p.checkpoint.every
    return step == p.steps - 1 or bool(every and (step + 1) % every == 0)


def _checkpoint(run: _Run, step: int, progress: Progress) -> Path:
    """The checkpoint after ``step``, once the step's commit is done (gfcr.checkpoints.resume), with
    the batches generated ahead of it (gfcr.runner.rounds)."""
    p, services = run.pipeline, run.rt.services
    run.commits.wait()
    run.owned()
    return Path(run.call(f"checkpoint[step={step}]", lambda: str(checkpoint.save(
        checkpoint.directory(run.root, run.run_id), run_id=run.run_id, step=step,
        spec_hash=p.spec_hash(), policy=run.policy, learner=services.learner,
        engine=services.generator, progress=progress, keep=p.checkpoint.keep,
        ahead=rounds.in_flight(run.rt)).path)))


def _cancel(run: _Run, last: int | None, progress: Progress, *, saved: bool) -> None:
    """Stop at this step boundary: the commit in flight finishes, the last whole step
    is checkpointed (unless it already is: ``saved``), and RunCancelled is raised."""
    run.commits.wait()
    path = None
    if last is not None and (saved or _checkpoint_due(run.pipeline, last)):
        newest = checkpoint.latest(checkpoint.directory(run.root, run.run_id))
        path = None if newest is None else newest.path
    elif last is not None:
        path = _checkpoint(run, last, progress)
    raise cancelled(run.run_id, last_step=last, checkpoint=path, reason=run.stop.reason)
