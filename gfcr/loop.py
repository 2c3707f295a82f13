"""One GFCR step, as pure orchestration.

::

    prompts  = Replay.select(...)            # each select stage extends the choice
    plan     = Control.allocate(prompts)     # samples and token budget per prompt
    rollouts = Generate(plan, engine)        # Control.on_segment hooks between segments
    rollouts = Filter...(rollouts)           # scores, then keep masks; rows never deleted
    (repeat the four lines above for more prompts while a filter reports a shortfall)
    batch    = Replay.augment(kept)          # mix in reused rollouts
    result   = Train.update(batch)           # advantages, loss, optimizer step; weights out
                                             # (an engine with sleep mode sleeps meanwhile)
    commit(run, step, everything)            # one transaction, exactly once

The loop does no I/O of its own: every stage call goes through ``call(name, fn, *refs)``
(the executor: a plain call, or a Prefect task named ``<stage>[step=N]``), and tables cross
calls as references through a :class:`Stash`. Only complete rollouts reach filters and
training (so a stopped rollout never reaches a scorer); partial and pruned ones are
committed with the reason they were not kept. Allocate stages get the plan with ``n`` and
``max_tokens`` filled in; on_segment hooks see the whole generate call in ``ctx.flight``.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterator, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gfcr.capabilities import EngineSleep, PlanDefaults
from gfcr.engine import Decision, Engine, Flight, Inflight
from gfcr.evaluation import evaluate  # noqa: F401 (gfcr.run imports it from here)
from gfcr.filters import applied, drop, merge_back, set_column
from gfcr.helper import charging
from gfcr.metrics import rollout_metrics
from gfcr.problems import tally
from gfcr.rewards import bounded
from gfcr.pipeline import Pipeline
from gfcr.rollout import PROMPT_SCHEMA, col, conform
from gfcr.stage import (ALLOCATE, AUGMENT, FILTER, GENERATE, ON_SEGMENT, REFILL, SELECT, TRAIN,
                        Allocate, Augment, Filter, Generate, Learner, OnSegment, Select, Stage,
                        StepContext)
from gfcr.storage import Committed, History


@dataclass(frozen=True)
class TableRef:
    """A staged table: what Prefect tasks pass instead of data."""

    key: str
    rows: int


class Stash(Protocol):
    """Where tables live between stage calls (files for Prefect, memory for tests)."""

    def put(self, key: str, table: pa.Table) -> TableRef: ...

    def get(self, ref: TableRef) -> pa.Table: ...

    def forget(self, prefix: str) -> None:
        """Drop the tables whose key starts with ``prefix``; the runtime calls it once a
        step's tables are committed and no longer read."""
        ...


Call = Callable[..., Any]
"""``call(name, fn, *args)``: run ``fn(*args)`` as the task called ``name``."""


class Committer(Protocol):
    def __call__(self, run_id: str, step: int, rollouts: pa.Table, *,
                 policy_version: int, metrics: dict[str, float]) -> Committed: ...


class RemoteGenerator(Protocol):
    """A generate stage run out of process: the raw rollouts of ``gen`` on ``plan``."""

    def generate(self, ctx: StepContext, gen: Generate, plan: pa.Table,
                 hooks: list[OnSegment], engine: Engine) -> pa.Table: ...

    def step_metrics(self, ctx: StepContext, rollouts: pa.Table) -> dict[str, float]:
        """Metrics of the step's remote calls (staleness, times)."""
        ...


class RemoteScorer(Protocol):
    """Scoring filter stages run out of process: ``stage``'s result on ``rows`` with its
    drops marked, or None to run the stage here (gfcr.remote.scoring)."""

    def score(self, ctx: StepContext, stage: Filter, rows: pa.Table) -> pa.Table | None: ...


@dataclass
class Runtime:
    """What the loop drives: the pipeline and the live objects built from it."""

    pipeline: Pipeline
    task: Any
    engine: Engine
    learner: Learner | None
    stash: Stash
    commit: Committer | None = None
    history: Callable[[int], History] | None = None
    """history(step) -> a History reader as of that step, for stages that query it."""
    background: Call | None = None
    """Runs the step's commit behind the loop (None: through ``call``, before the step
    returns). It returns at once; the executor keeps commits in step order and finishes
    each before the next step's history is read, before a checkpoint and before the run
    ends (gfcr.run). The commit's inputs are fixed when it is handed over."""
    remote: RemoteGenerator | None = None
    """Runs the generate stage elsewhere (gfcr.remote.dispatch: on engine workers);
    None: on ``engine`` in this process."""
    scoring: RemoteScorer | None = None
    """Runs the scoring filter stages elsewhere (on engine workers); None: here."""


@dataclass
class StepReport:
    """What one step did: metrics for tracking, and the committed table reference."""

    step: int
    metrics: dict[str, float] = field(default_factory=dict)
    rollouts: TableRef | None = None
    errors: list[tuple[str, int]] = field(default_factory=list)
    """The step's distinct scorer errors (``score_error``) with their counts."""
    cpu: dict[str, float] = field(default_factory=dict)
    """CPU seconds of each stage's own work, on the thread that ran it (its wall seconds
    are the ``time/<stage>`` metrics): what is left of the step is the runtime's."""


class StageClock:
    """Wall and CPU seconds of the stage calls of one step, summed per stage over refill
    rounds. It times the stage's own work inside whatever the executor wraps around it
    (a Prefect task run, staging), so the step's time minus the stages' is the
    runtime's share (bench/_overhead.py). CPU is the calling thread's plus what helper
    threads spent on the stage's calls (gfcr.helper)."""

    def __init__(self) -> None:
        self.wall: dict[str, float] = {}
        self.cpu: dict[str, float] = {}

    def timed(self, label: str, fn: Callable) -> Callable:
        def run(*args: Any) -> Any:
            wall, cpu = time.perf_counter(), time.thread_time()
            with charging() as helpers:
                try:
                    return fn(*args)
                finally:
                    self._add(label, time.perf_counter() - wall,
                              time.thread_time() - cpu + helpers[0])
        return run

    def _add(self, label: str, wall: float, cpu: float) -> None:
        self.wall[label] = self.wall.get(label, 0.0) + wall
        self.cpu[label] = self.cpu.get(label, 0.0) + cpu


def context(rt: Runtime, run_id: str, step: int) -> StepContext:
    history = rt.history(step) if rt.history else None
    return StepContext(run_id=run_id, step=step, seed=rt.pipeline.seed,
                       policy_version=rt.engine.version, task=rt.task, history=history)


MAX_ROUNDS = 16
"""Hard cap on generation rounds in one step, whatever the refill filters ask."""


def run_step(rt: Runtime, run_id: str, step: int, call: Call) -> StepReport:
    """Run one step; every stage call goes through ``call``."""
    started, clock = time.perf_counter(), StageClock()
    commit_call, call = call, _clocked(call, clock)  # the commit is the runtime's, untimed
    ctx = context(rt, run_id, step)
    ref, rounds = _round(rt, ctx, call), 1
    while rounds < MAX_ROUNDS:
        want = _shortfall(rt, ctx.for_round(rounds, 0), rt.stash.get(ref))
        if want <= 0:
            break
        more = _round(rt, ctx.for_round(rounds, want), call)
        ref = rt.stash.put(f"{step}/merged-{rounds}", pa.concat_tables(
            [rt.stash.get(ref), rt.stash.get(more)], promote_options="permissive"))
        rounds += 1
    table, clipped = bounded(rt.stash.get(ref), rt.pipeline.reward_range, step)
    ref = rt.stash.put(f"{step}/bounded", table) if clipped else ref
    metrics: dict[str, float] = {"rounds": float(rounds), "reward_out_of_range": float(clipped)}
    for s in AUGMENT.of(rt.pipeline.stages):
        ref = call(_name(s, ctx), _augment_fn(rt, ctx, s), ref)
    trainer = TRAIN.of(rt.pipeline.stages)
    if trainer and rt.learner is not None:
        ref, train_metrics = call(_name(trainer[0], ctx), _train_fn(rt, ctx), ref)
        metrics.update(train_metrics)
    final = rt.stash.get(ref)
    metrics.update(rollout_metrics(final))
    if rt.remote is not None:
        metrics.update(rt.remote.step_metrics(ctx, final))
    metrics["policy_version"] = float(rt.engine.version)
    metrics.update({f"time/{label}": seconds for label, seconds in clock.wall.items()})
    metrics["step_seconds"] = time.perf_counter() - started
    if rt.commit is not None:
        commit = _commit_fn(rt, run_id, step, dict(metrics), rt.engine.version)
        (rt.background or commit_call)(f"commit[step={step}]", commit, ref)
    return StepReport(step=step, metrics=metrics, rollouts=ref, cpu=dict(clock.cpu),
                      errors=tally(final.column(col.SCORE_ERROR).to_pylist()))


def _clocked(call: Call, clock: StageClock) -> Call:
    """``call`` that times each stage's own work (the label before ``[``) on ``clock``."""
    def timed_call(name: str, fn: Callable, *args: Any) -> Any:
        return call(name, clock.timed(name.split("[", 1)[0], fn), *args)
    return timed_call


def _round(rt: Runtime, ctx: StepContext, call: Call) -> TableRef:
    """Select, allocate, generate and filter once; refill rounds repeat this."""
    stages = rt.pipeline.stages
    ref = rt.stash.put(_key(ctx, "prompts"), PROMPT_SCHEMA.empty_table())
    for chooser in SELECT.of(stages):
        ref = call(_name(chooser, ctx), _select_fn(rt, ctx, chooser), ref)
    gen = GENERATE.of(stages)[0]
    for planner in ALLOCATE.of(stages):
        ref = call(_name(planner, ctx), _allocate_fn(rt, ctx, planner, gen), ref)
    ref = call(_name(gen, ctx), _generate_fn(rt, ctx, gen), ref)
    for f in FILTER.of(stages):
        ref = call(_name(f, ctx), _filter_fn(rt, ctx, f), ref)
    return ref


def _shortfall(rt: Runtime, ctx: StepContext, table: pa.Table) -> int:
    """The most extra prompts any refill filter asks for (see gfcr.stage.Refill)."""
    complete = table.filter(pc.equal(table.column(col.STATUS), "complete"))
    asks = [s.shortfall(ctx, complete) for s in REFILL.of(rt.pipeline.stages)]
    return max(asks, default=0)


def _name(stage: Stage, ctx: StepContext) -> str:
    suffix = f",round={ctx.round}" if ctx.round else ""
    return f"{stage.label}[step={ctx.step}{suffix}]"


def _key(ctx: StepContext, what: str) -> str:
    return f"{ctx.step}/{ctx.round}/{what}"


# --------------------------------------------------------------------------- stage calls


def _select_fn(rt: Runtime, ctx: StepContext, s: Select) -> Callable:
    def fn(ref: TableRef) -> TableRef:
        return rt.stash.put(_key(ctx, s.label), s.select(ctx, rt.stash.get(ref)))
    return fn


def _allocate_fn(rt: Runtime, ctx: StepContext, s: Allocate, gen: Generate) -> Callable:
    def fn(ref: TableRef) -> TableRef:
        # the plan an allocate stage sees holds real numbers for n and max_tokens
        table = plan_defaults(rt.stash.get(ref), gen)
        return rt.stash.put(_key(ctx, s.label), s.allocate(ctx, table))
    return fn


def plan_defaults(plan: pa.Table, gen: Generate) -> pa.Table:
    """``plan`` with ``n`` and ``max_tokens`` columns, nulls set to the generate stage's
    fields of those names (when it has them)."""
    defaults = gen.plan_defaults() if isinstance(gen, PlanDefaults) else {}
    for name, default in defaults.items():
        if name not in plan.column_names:
            plan = plan.append_column(name, pa.array([default] * plan.num_rows, pa.int64()))
        else:
            filled = pc.fill_null(plan.column(name).cast(pa.int64()), default)
            plan = plan.set_column(plan.schema.get_field_index(name), name, filled)
    return plan


class SegmentHooks:
    """The control stages' on_segment hooks as the one engine hook; "prune" wins over "stop".
    Hooks get ``ctx.flight``, the whole call (:class:`gfcr.engine.Flight`): a generate stage
    declares each request's group with ``expect(groups)`` before generating (duck-typed)."""

    def __init__(self, ctx: StepContext, hooks: list[OnSegment]) -> None:
        self.hooks, self.base = hooks, ctx
        self.expect({})

    def expect(self, groups: dict[int, str]) -> None:
        """Start a new engine call whose request ``key -> group id`` is ``groups``."""
        self.flight = Flight(groups=dict(groups))
        self.ctx = replace(self.base, flight=self.flight)

    def wave(self, keys: list[int]) -> None:
        """The engine starts a wave of requests ``keys`` (see gfcr.engine.SegmentHook)."""
        self.flight.start(keys)

    def __call__(self, inflight: list[Inflight]) -> dict[int, Decision]:
        self.flight.observe(inflight)
        decisions: dict[int, Decision] = {}
        for hook in self.hooks:
            for key, decision in hook.on_segment(self.ctx, inflight).items():
                if decisions.get(key) != "prune":  # prune wins over stop
                    decisions[key] = decision
        self.flight.decided(decisions, inflight)
        return decisions


def _generate_fn(rt: Runtime, ctx: StepContext, gen: Generate) -> Callable:
    hooks = ON_SEGMENT.of(rt.pipeline.stages)

    def fn(ref: TableRef) -> TableRef:
        if rt.remote is not None:
            table = rt.remote.generate(ctx, gen, rt.stash.get(ref), hooks, rt.engine)
        else:
            on_segment = SegmentHooks(ctx, hooks) if hooks else None
            table = gen.generate(ctx, rt.stash.get(ref), rt.engine, on_segment)
        table = conform(table, where=f"output of generate stage {gen.label!r}")
        return rt.stash.put(_key(ctx, gen.label), _mark_unfinished(table, gen.label))
    return fn


def _mark_unfinished(table: pa.Table, label: str) -> pa.Table:
    """Partial and pruned rollouts are stored but not trained on."""
    unfinished = pc.not_equal(table.column(col.STATUS), "complete")
    return drop(table, unfinished, label, pc.if_else(unfinished, table.column(col.STATUS), None))


def _filter_fn(rt: Runtime, ctx: StepContext, s: Filter) -> Callable:
    def fn(ref: TableRef) -> TableRef:
        table = rt.stash.get(ref)
        complete = pc.equal(table.column(col.STATUS), "complete")
        idx = np.flatnonzero(complete.to_numpy(zero_copy_only=False))
        part = table.take(idx)
        scored = rt.scoring.score(ctx, s, part) if rt.scoring is not None else None
        merged = merge_back(table, idx, scored if scored is not None
                            else applied(s.apply(ctx, part), s.label))
        return rt.stash.put(_key(ctx, s.label), merged)
    return fn


def _augment_fn(rt: Runtime, ctx: StepContext, s: Augment) -> Callable:
    def fn(ref: TableRef) -> TableRef:
        return rt.stash.put(_key(ctx, s.label), s.augment(ctx, rt.stash.get(ref)))
    return fn


def _train_fn(rt: Runtime, ctx: StepContext) -> Callable:
    def fn(ref: TableRef) -> tuple[TableRef, dict[str, float]]:
        table = rt.stash.get(ref)
        kept = np.flatnonzero(table.column(col.KEPT).to_numpy(zero_copy_only=False))
        if len(kept) == 0:
            return ref, {"train/skipped": 1.0}
        with _asleep(rt.engine):
            result = rt.learner.update(ctx, table.take(kept))  # type: ignore[union-attr]
        advantage = np.full(table.num_rows, np.nan)
        advantage[kept] = result.advantages
        consumed = np.full(table.num_rows, -1)
        consumed[kept] = ctx.step
        table = set_column(table, col.ADVANTAGE, pa.array(advantage, from_pandas=True))
        table = set_column(table, col.CONSUMED_AT_STEP,
                     pa.array(consumed, mask=consumed < 0, type=pa.int64()))
        rt.engine.update_weights()
        metrics = {f"train/{k}": float(v) for k, v in result.metrics.items()}
        return rt.stash.put(_key(ctx, "train"), table), metrics
    return fn


@contextlib.contextmanager
def _asleep(engine: Any) -> Iterator[None]:
    """The engine asleep while the learner updates, if it sleeps (EngineSleep); awake
    again before the weight sync that follows."""
    sleeps = isinstance(engine, EngineSleep) and engine.sleep_mode
    if sleeps:
        engine.sleep()
    try:
        yield
    finally:
        if sleeps:
            engine.wake_up()


def _commit_fn(rt: Runtime, run_id: str, step: int, metrics: dict[str, float],
               policy_version: int) -> Callable:
    """The step's commit; takes the version and metrics as the step left them, since it
    may run while the next step trains (see Runtime.background)."""
    def fn(ref: TableRef) -> str:
        result = rt.commit(run_id, step, rt.stash.get(ref),  # type: ignore[misc]
                           policy_version=policy_version, metrics=metrics)
        return result.message
    return fn
