"""A step's generation rounds: select, allocate, generate and filter; and the rounds of
later steps drawn ahead, for asynchronous steps.

With ``Pipeline.max_staleness = k > 0``, once step t has its round-0 batch the loop
draws the plans of steps t+1..t+k (the same select and allocate stages, each step's own
seeds, the run's history as of step t) and submits them to the generator, which
generates them while step t filters, trains and commits. The generator first loads the
learner's newest weights, so the round-0 batch of step s is generated with the weights
the run had at the start of step max(s - k, 0): at most k versions behind the step that
trains on it. A plan drawn ahead is used as drawn (stage decisions lag k steps, which is
what bounded staleness means); nothing draws it again. Rows keep the version they were
generated with (``policy_version_start``), which the learner's decoupled-PPO correction
uses (stages/train/offpolicy.py), and the step records ``staleness/mean`` and ``/max``.

A checkpoint holds the batches in flight, finished (:func:`in_flight`), so a run
stopped with a round in flight resumes as the uninterrupted run (:func:`resume_ahead`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gfcr.core.capabilities import PlanDefaults
from gfcr.core.rollout import PROMPT_SCHEMA, col, conform
from gfcr.core.services import Done, Pending
from gfcr.core.stage import (ALLOCATE, FILTER, GENERATE, ON_SEGMENT, REFILL, SELECT, Allocate,
                             Filter, Generate, Select, Stage, StepContext)
from gfcr.core.filters import drop, merge_back
from gfcr.runner.runtime import Call, Planned, Runtime, TableRef, context


def first_round(rt: Runtime, ctx: StepContext, call: Call) -> TableRef:
    """Round 0 of ``ctx.step`` (drawn ahead when it was), then the rounds of the steps
    ahead of it drawn and submitted, then its filters."""
    planned = rt.ahead.pop(ctx.step, None)
    gen = GENERATE.of(rt.pipeline.stages)[0]
    if planned is None:
        ref = plan(rt, ctx, call)
        ref = call(name(gen, ctx), _generate_fn(rt, ctx, gen, None), ref)
    else:
        ref = call(name(gen, ctx), _generate_fn(rt, ctx, gen, planned.pending), planned.plan)
    _draw_ahead(rt, ctx, call)
    return _filter(rt, ctx, call, ref)


def next_round(rt: Runtime, ctx: StepContext, call: Call) -> TableRef:
    """A refill round: select, allocate, generate and filter once more."""
    gen = GENERATE.of(rt.pipeline.stages)[0]
    ref = call(name(gen, ctx), _generate_fn(rt, ctx, gen, None), plan(rt, ctx, call))
    return _filter(rt, ctx, call, ref)


def plan(rt: Runtime, ctx: StepContext, call: Call) -> TableRef:
    """The round's plan: the select stages' prompts, then the allocate stages' budget."""
    stages = rt.pipeline.stages
    ref = rt.stash.put(key(ctx, "prompts"), PROMPT_SCHEMA.empty_table())
    for chooser in SELECT.of(stages):
        ref = call(name(chooser, ctx), _select_fn(rt, ctx, chooser), ref)
    gen = GENERATE.of(stages)[0]
    for planner in ALLOCATE.of(stages):
        ref = call(name(planner, ctx), _allocate_fn(rt, ctx, planner, gen), ref)
    return ref


def _filter(rt: Runtime, ctx: StepContext, call: Call, ref: TableRef) -> TableRef:
    for f in FILTER.of(rt.pipeline.stages):
        ref = call(name(f, ctx), _filter_fn(rt, ctx, f), ref)
    return ref


def _draw_ahead(rt: Runtime, ctx: StepContext, call: Call) -> None:
    """Draw and submit the round-0 plans of the next ``max_staleness`` steps not yet
    drawn, with the learner's newest weights loaded first."""
    p, services = rt.pipeline, rt.services
    later = [s for s in range(ctx.step + 1, min(ctx.step + p.max_staleness, p.steps - 1) + 1)
             if s not in rt.ahead]
    if not later:
        return
    if services.generator.version != services.learner.version:
        services.generator.load(services.learner.handle())
    gen, hooks = GENERATE.of(p.stages)[0], ON_SEGMENT.of(p.stages)
    for step in later:
        ahead = replace(context(rt, ctx.run_id, step), history=ctx.history)
        ref = plan(rt, ahead, call)
        pending = services.generator.submit(ahead, gen, rt.stash.get(ref), hooks)
        rt.ahead[step] = Planned(ref, pending)


def in_flight(rt: Runtime) -> dict[int, pa.Table]:
    """The batches drawn ahead, each waited for: what a checkpoint keeps of them."""
    done = {}
    for step, planned in sorted(rt.ahead.items()):
        done[step] = planned.pending.result()
        rt.ahead[step] = Planned(planned.plan, Done(done[step]))
    return done


def resume_ahead(rt: Runtime, run_id: str, batches: dict[int, pa.Table]) -> None:
    """Put the batches a checkpoint kept back in flight, as the stopped run had them."""
    for step, table in batches.items():
        ctx = context(rt, run_id, step)
        ref = rt.stash.put(key(ctx, "prompts"), PROMPT_SCHEMA.empty_table())
        rt.ahead[step] = Planned(ref, Done(table))


def shortfall(rt: Runtime, ctx: StepContext, table: pa.Table) -> int:
    """The most extra prompts any refill filter asks for (see gfcr.core.stage.Refill)."""
    complete = table.filter(pc.equal(table.column(col.STATUS), "complete"))
    asks = [s.shortfall(ctx, complete) for s in REFILL.of(rt.pipeline.stages)]
    return max(asks, default=0)


def staleness(rollouts: pa.Table, version: int) -> dict[str, float]:
    """How many versions older than ``version`` (the step's) the weights that generated
    the step's rows were: mean and max over rows, 0 for a synchronous step."""
    start = rollouts.column(col.POLICY_VERSION_START).to_numpy(zero_copy_only=False)
    start = np.asarray(start, dtype=float)
    known = ~np.isnan(start)
    if not known.any():
        return {"staleness/mean": 0.0, "staleness/max": 0.0}
    lag = np.maximum(version - start[known], 0.0)
    return {"staleness/mean": float(lag.mean()), "staleness/max": float(lag.max())}


def name(stage: Stage, ctx: StepContext) -> str:
    suffix = f",round={ctx.round}" if ctx.round else ""
    return f"{stage.label}[step={ctx.step}{suffix}]"


def key(ctx: StepContext, what: str) -> str:
    return f"{ctx.step}/{ctx.round}/{what}"


# --------------------------------------------------------------------------- stage calls


def _select_fn(rt: Runtime, ctx: StepContext, s: Select) -> Callable:
    def fn(ref: TableRef) -> TableRef:
        return rt.stash.put(key(ctx, s.label), s.select(ctx, rt.stash.get(ref)))
    return fn


def _allocate_fn(rt: Runtime, ctx: StepContext, s: Allocate, gen: Generate) -> Callable:
    def fn(ref: TableRef) -> TableRef:
        # the plan an allocate stage sees holds real numbers for n and max_tokens
        table = plan_defaults(rt.stash.get(ref), gen)
        return rt.stash.put(key(ctx, s.label), s.allocate(ctx, table))
    return fn


def plan_defaults(plan: pa.Table, gen: Generate) -> pa.Table:
    """``plan`` with ``n`` and ``max_tokens`` columns, nulls set to the generate stage's
    fields of those names (when it has them)."""
    defaults = gen.plan_defaults() if isinstance(gen, PlanDefaults) else {}
    for field_name, default in defaults.items():
        if field_name not in plan.column_names:
            plan = plan.append_column(field_name,
                                      pa.array([default] * plan.num_rows, pa.int64()))
        else:
            filled = pc.fill_null(plan.column(field_name).cast(pa.int64()), default)
            plan = plan.set_column(plan.schema.get_field_index(field_name), field_name,
                                   filled)
    return plan


def _generate_fn(rt: Runtime, ctx: StepContext, gen: Generate,
                 pending: Pending | None) -> Callable:
    """The generate call: waits for ``pending`` (a batch drawn ahead), or submits the
    plan it is given and waits. A retried call submits again."""
    hooks = ON_SEGMENT.of(rt.pipeline.stages)
    waiting = [pending] if pending is not None else []

    def fn(ref: TableRef) -> TableRef:
        started = waiting.pop() if waiting else \
            rt.services.generator.submit(ctx, gen, rt.stash.get(ref), hooks)
        table = conform(started.result(), where=f"output of generate stage {gen.label!r}")
        return rt.stash.put(key(ctx, gen.label), _mark_unfinished(table, gen.label))
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
        scored = rt.services.scorer.score(ctx, s, table.take(idx))
        return rt.stash.put(key(ctx, s.label), merge_back(table, idx, scored))
    return fn
