"""One GFCR step, as pure orchestration.

::

    prompts  = Replay.select(...)            # each select stage extends the choice
    plan     = Control.allocate(prompts)     # samples and token budget per prompt
    rollouts = Generate(plan, engine)        # Control.on_segment hooks between segments
    rollouts = Filter...(rollouts)           # scores, then keep masks; rows never deleted
    (repeat the four lines above for more prompts while a filter reports a shortfall)
    batch    = Replay.augment(kept)          # mix in reused rollouts
    result   = Train.update(batch)           # advantages, loss, optimizer step; weights out
    commit(run, step, everything)            # one transaction, exactly once

The loop does no I/O of its own: every stage call goes through ``call(name, fn, *refs)``
(the executor: a plain call, or a Prefect task named ``<stage>[step=N]``), and tables cross
calls as references through a :class:`Stash`. Only complete rollouts reach filters and
training (so a stopped rollout never reaches a scorer); partial and pruned ones are
committed with the reason they were not kept. Allocate stages get the plan with ``n`` and
``max_tokens`` filled in; on_segment hooks see the whole generate call in ``ctx.flight``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gfcr.engine import Decision, Engine, Flight, GenRequest, Inflight, SamplingParams
from gfcr.helper import charging
from gfcr.metrics import rollout_metrics
from gfcr.pipeline import Pipeline
from gfcr.rollout import PROMPT_SCHEMA, col, conform
from gfcr.stage import FilterResult, Learner, StageSpec, StepContext, implements


@dataclass(frozen=True)
class TableRef:
    """A staged table: what Prefect tasks pass instead of data."""

    key: str
    rows: int


class Stash(Protocol):
    """Where tables live between stage calls (files for Prefect, memory for tests)."""

    def put(self, key: str, table: pa.Table) -> TableRef: ...

    def get(self, ref: TableRef) -> pa.Table: ...


Call = Callable[..., Any]
"""``call(name, fn, *args)``: run ``fn(*args)`` as the task called ``name``."""


class Committer(Protocol):
    def __call__(self, run_id: str, step: int, rollouts: pa.Table, *,
                 policy_version: int, metrics: dict[str, float]) -> Any: ...


@dataclass
class Runtime:
    """What the loop drives: the pipeline and the live objects built from it."""

    pipeline: Pipeline
    task: Any
    engine: Engine
    learner: Learner | None
    stash: Stash
    commit: Committer | None = None
    history: Callable[[int], Any] | None = None
    """history(step) -> a History reader as of that step, for stages that query it."""
    background: Call | None = None
    """Runs the step's commit behind the loop (None: through ``call``, before the step
    returns). It returns at once; the executor keeps commits in step order and finishes
    each before the next step's history is read, before a checkpoint and before the run
    ends (gfcr.run). The commit's inputs are fixed when it is handed over."""


@dataclass
class StepReport:
    """What one step did: metrics for tracking, and the committed table reference."""

    step: int
    metrics: dict[str, float] = field(default_factory=dict)
    rollouts: TableRef | None = None
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
    metrics: dict[str, float] = {"rounds": float(rounds)}
    for s in rt.pipeline.stages:
        if s.kind == "replay" and implements(s, "augment"):
            ref = call(_name(s, ctx), _augment_fn(rt, ctx, s), ref)
    trainer = rt.pipeline.of_kind("train")
    if trainer and rt.learner is not None:
        ref, train_metrics = call(_name(trainer[0], ctx), _train_fn(rt, ctx), ref)
        metrics.update(train_metrics)
    metrics.update(rollout_metrics(rt.stash.get(ref)))
    metrics["policy_version"] = float(rt.engine.version)
    metrics.update({f"time/{label}": seconds for label, seconds in clock.wall.items()})
    metrics["step_seconds"] = time.perf_counter() - started
    if rt.commit is not None:
        commit = _commit_fn(rt, run_id, step, dict(metrics), rt.engine.version)
        (rt.background or commit_call)(f"commit[step={step}]", commit, ref)
    return StepReport(step=step, metrics=metrics, rollouts=ref, cpu=dict(clock.cpu))


def _clocked(call: Call, clock: StageClock) -> Call:
    """``call`` that times each stage's own work (the label before ``[``) on ``clock``."""
    def timed_call(name: str, fn: Callable, *args: Any) -> Any:
        return call(name, clock.timed(name.split("[", 1)[0], fn), *args)
    return timed_call


def _round(rt: Runtime, ctx: StepContext, call: Call) -> TableRef:
    """Select, allocate, generate and filter once; refill rounds repeat this."""
    stages = rt.pipeline.stages
    ref = rt.stash.put(_key(ctx, "prompts"), PROMPT_SCHEMA.empty_table())
    for s in stages:
        if s.kind == "replay" and implements(s, "select"):
            ref = call(_name(s, ctx), _table_fn(rt, ctx, s, "select"), ref)
    gen = rt.pipeline.of_kind("generate")[0]
    for s in stages:
        if s.kind == "control" and implements(s, "allocate"):
            ref = call(_name(s, ctx), _table_fn(rt, ctx, s, "allocate", gen), ref)
    ref = call(_name(gen, ctx), _generate_fn(rt, ctx, gen), ref)
    for s in stages:
        if s.kind == "filter":
            ref = call(_name(s, ctx), _filter_fn(rt, ctx, s), ref)
    return ref


def _shortfall(rt: Runtime, ctx: StepContext, table: pa.Table) -> int:
    """The most extra prompts any refill filter asks for (see gfcr.stage.Refill)."""
    complete = table.filter(pc.equal(table.column(col.STATUS), "complete"))
    asks = [s.shortfall(ctx, complete) for s in rt.pipeline.stages
            if s.kind == "filter" and implements(s, "shortfall")]
    return max(asks, default=0)


def _name(stage: StageSpec, ctx: StepContext) -> str:
    suffix = f",round={ctx.round}" if ctx.round else ""
    return f"{stage.label}[step={ctx.step}{suffix}]"


def _key(ctx: StepContext, what: str) -> str:
    return f"{ctx.step}/{ctx.round}/{what}"


# --------------------------------------------------------------------------- stage calls


def _table_fn(rt: Runtime, ctx: StepContext, s: StageSpec, method: str,
              gen: StageSpec | None = None) -> Callable:
    def fn(ref: TableRef) -> TableRef:
        table = rt.stash.get(ref)
        if gen is not None:  # allocate: the plan holds real numbers for n and max_tokens
            table = plan_defaults(table, gen)
        return rt.stash.put(_key(ctx, s.label), getattr(s, method)(ctx, table))
    return fn


def plan_defaults(plan: pa.Table, gen: StageSpec) -> pa.Table:
    """``plan`` with ``n`` and ``max_tokens`` columns, nulls set to the generate stage's
    fields of those names (when it has them)."""
    for name in ("n", "max_tokens"):
        default = getattr(gen, name, None)
        if isinstance(default, int) and name not in plan.column_names:
            plan = plan.append_column(name, pa.array([default] * plan.num_rows, pa.int64()))
        elif isinstance(default, int):
            filled = pc.fill_null(plan.column(name).cast(pa.int64()), default)
            plan = plan.set_column(plan.schema.get_field_index(name), name, filled)
    return plan


class SegmentHooks:
    """The control stages' on_segment hooks as the one engine hook; "prune" wins over "stop".
    Hooks get ``ctx.flight``, the whole call (:class:`gfcr.engine.Flight`): a generate stage
    declares each request's group with ``expect(groups)`` before generating (duck-typed)."""

    def __init__(self, ctx: StepContext, hooks: list[StageSpec]) -> None:
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


def _generate_fn(rt: Runtime, ctx: StepContext, gen: StageSpec) -> Callable:
    hooks = [s for s in rt.pipeline.stages
             if s.kind == "control" and implements(s, "on_segment")]

    def fn(ref: TableRef) -> TableRef:
        on_segment = SegmentHooks(ctx, hooks) if hooks else None
        table = gen.generate(ctx, rt.stash.get(ref), rt.engine, on_segment)
        table = conform(table, where=f"output of generate stage {gen.label!r}")
        return rt.stash.put(_key(ctx, gen.label), _mark_unfinished(table, gen.label))
    return fn


def _mark_unfinished(table: pa.Table, label: str) -> pa.Table:
    """Partial and pruned rollouts are stored but not trained on."""
    unfinished = pc.not_equal(table.column(col.STATUS), "complete")
    return drop(table, unfinished, label, pc.if_else(unfinished, table.column(col.STATUS), None))


def _filter_fn(rt: Runtime, ctx: StepContext, s: StageSpec) -> Callable:
    def fn(ref: TableRef) -> TableRef:
        table = rt.stash.get(ref)
        complete = pc.equal(table.column(col.STATUS), "complete")
        idx = np.flatnonzero(complete.to_numpy(zero_copy_only=False))
        result = s.apply(ctx, table.take(idx))
        merged = _merge(table, idx, _applied(result, s.label))
        return rt.stash.put(_key(ctx, s.label), merged)
    return fn


def _applied(result: FilterResult, label: str) -> pa.Table:
    if result.keep is None:
        return result.table
    keep = pa.array(result.keep, pa.bool_())
    if len(keep) != result.table.num_rows:
        raise ValueError(f"filter {label!r} returned a keep mask of {len(keep)} values for "
                         f"{result.table.num_rows} rows")
    reason = result.reason
    reasons = pa.array(reason if isinstance(reason, list) else [reason] * len(keep), pa.string())
    return drop(result.table, pc.invert(keep), label, reasons)


def drop(table: pa.Table, mask: Any, label: str, reasons: Any) -> pa.Table:
    """Mark rows where ``mask`` is true and that are still kept as dropped by ``label``.

    A row keeps the first stage that dropped it; rows are never removed.
    """
    newly = pc.and_(pc.fill_null(mask, False), table.column(col.KEPT))
    table = _set(table, col.DROPPED_BY, pc.if_else(newly, label, table.column(col.DROPPED_BY)))
    table = _set(table, col.DROP_REASON,
                 pc.if_else(newly, reasons, table.column(col.DROP_REASON)))
    return _set(table, col.KEPT, pc.and_(table.column(col.KEPT), pc.invert(newly)))


def _set(table: pa.Table, name: str, values: Any) -> pa.Table:
    i = table.schema.get_field_index(name)
    return table.set_column(i, table.schema.field(i), values)


def _merge(table: pa.Table, idx: np.ndarray, part: pa.Table) -> pa.Table:
    """Write the filtered subset's rows back at positions ``idx`` of ``table``."""
    if part.num_rows != len(idx):
        raise ValueError(f"a filter returned {part.num_rows} rows for {len(idx)}; filters "
                         "must not add or remove rows (return a keep mask instead)")
    if len(idx) == table.num_rows:
        return conform(part, where="filter output")
    rest = np.setdiff1d(np.arange(table.num_rows), idx)
    order = np.argsort(np.concatenate([idx, rest]), kind="stable")
    others = table.take(rest)
    for name in part.column_names:
        if name not in others.column_names:
            others = others.append_column(part.schema.field(name).with_nullable(True),
                                          pa.nulls(others.num_rows, part.schema.field(name).type))
    combined = pa.concat_tables([part, others.select(part.column_names)], promote_options="permissive")
    return conform(combined.take(order), where="filter output")


def _augment_fn(rt: Runtime, ctx: StepContext, s: StageSpec) -> Callable:
    def fn(ref: TableRef) -> TableRef:
        return rt.stash.put(_key(ctx, s.label), s.augment(ctx, rt.stash.get(ref)))
    return fn


def _train_fn(rt: Runtime, ctx: StepContext) -> Callable:
    def fn(ref: TableRef) -> tuple[TableRef, dict[str, float]]:
        table = rt.stash.get(ref)
        kept = np.flatnonzero(table.column(col.KEPT).to_numpy(zero_copy_only=False))
        if len(kept) == 0:
            return ref, {"train/skipped": 1.0}
        result = rt.learner.update(ctx, table.take(kept))  # type: ignore[union-attr]
        advantage = np.full(table.num_rows, np.nan)
        advantage[kept] = result.advantages
        consumed = np.full(table.num_rows, -1)
        consumed[kept] = ctx.step
        table = _set(table, col.ADVANTAGE, pa.array(advantage, from_pandas=True))
        table = _set(table, col.CONSUMED_AT_STEP,
                     pa.array(consumed, mask=consumed < 0, type=pa.int64()))
        rt.engine.update_weights()
        metrics = {f"train/{k}": float(v) for k, v in result.metrics.items()}
        return rt.stash.put(_key(ctx, "train"), table), metrics
    return fn


def _commit_fn(rt: Runtime, run_id: str, step: int, metrics: dict[str, float],
               policy_version: int) -> Callable:
    """The step's commit; takes the version and metrics as the step left them, since it
    may run while the next step trains (see Runtime.background)."""
    def fn(ref: TableRef) -> str:
        result = rt.commit(run_id, step, rt.stash.get(ref),  # type: ignore[misc]
                           policy_version=policy_version, metrics=metrics)
        return str(getattr(result, "message", "committed"))
    return fn


def evaluate(task: Any, engine: Engine, prompts: pa.Table, *, max_tokens: int,
             stop: tuple[str, ...] = ()) -> dict[str, float]:
    """Greedy accuracy on held-out prompts: the share scored as fully correct."""
    rows = prompts.to_pylist()
    requests = [GenRequest(key=i, prompt_ids=engine.encode(r[col.PROMPT]))
                for i, r in enumerate(rows)]
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, stop=stop,
                            segment_tokens=max_tokens)
    outputs = engine.generate(requests, params)
    scores = []
    for row, out in zip(rows, outputs):
        try:
            scores.append(float(task.score(engine.decode(out.completion_ids),
                                           row[col.ANSWER], row[col.META])))
        except Exception:  # a scorer error counts as wrong, never kills evaluation
            scores.append(0.0)
    return {"accuracy": float(np.mean(np.asarray(scores) >= 1.0)) if scores else 0.0,
            "n": float(len(scores))}
