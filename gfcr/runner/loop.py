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

The loop talks to services (gfcr.core.services: a generator, a learner, a scorer), wherever
they run; every stage call goes through ``call(name, fn, *refs)`` (the executor: a plain
call, or a Prefect task named ``<stage>[step=N]``), and tables cross calls as references
through a :class:`gfcr.runner.runtime.Stash`. With ``max_staleness = k > 0`` the round-0
batches of the next k steps generate while this one trains (gfcr.runner.rounds). Only complete
rollouts reach filters and training (so a stopped rollout never reaches a scorer);
partial and pruned ones are
committed with the reason they were not kept. Allocate stages get the plan with ``n`` and
``max_tokens`` filled in; on_segment hooks see the whole generate call in ``ctx.flight``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import pyarrow as pa

from gfcr.config.problems import tally
from gfcr.core.rollout import col, scorer_failed
from gfcr.core.stage import AUGMENT, TRAIN, Augment, StepContext
from gfcr.core.filters import set_column
from gfcr.procs.helper import charging
from gfcr.runner.metrics import rollout_metrics
from gfcr.runner.tool_metrics import tool_metrics
from gfcr.runner.rewards import bounded
from gfcr.runner.rounds import first_round, key, name, next_round, shortfall, staleness
from gfcr.runner.runtime import Call, Runtime, TableRef, context


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
    threads spent on the stage's calls (gfcr.procs.helper)."""

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


MAX_ROUNDS = 16
"""Hard cap on generation rounds in one step, whatever the refill filters ask."""


def run_step(rt: Runtime, run_id: str, step: int, call: Call) -> StepReport:
    """Run one step; every stage call goes through ``call``."""
    started, clock = time.perf_counter(), StageClock()
    commit_call, call = call, _clocked(call, clock)  # the commit is the runtime's, untimed
    ctx = context(rt, run_id, step)
    ref, rounds = first_round(rt, ctx, call), 1
    while rounds < MAX_ROUNDS:
        want = shortfall(rt, ctx.for_round(rounds, 0), rt.stash.get(ref))
        if want <= 0:
            break
        more = next_round(rt, ctx.for_round(rounds, want), call)
        ref = rt.stash.put(f"{step}/merged-{rounds}", pa.concat_tables(
            [rt.stash.get(ref), rt.stash.get(more)], promote_options="permissive"))
        rounds += 1
    table, clipped = bounded(rt.stash.get(ref), rt.pipeline.reward_range, step)
    ref = rt.stash.put(f"{step}/bounded", table) if clipped else ref
    metrics: dict[str, float] = {"rounds": float(rounds), "reward_out_of_range": float(clipped)}
    for s in AUGMENT.of(rt.pipeline.stages):
        ref = call(name(s, ctx), _augment_fn(rt, ctx, s), ref)
    if rt.record.replay is not None:  # a replayed step trains on the store's rows
        stored, replay_metrics = rt.record.replay(step, rt.stash.get(ref))
        ref = rt.stash.put(f"{step}/stored", stored)
        metrics.update(replay_metrics)
    trainer = TRAIN.of(rt.pipeline.stages)
    if trainer:
        ref, train_metrics = call(name(trainer[0], ctx), _train_fn(rt, ctx), ref)
        metrics.update(train_metrics)
    final = rt.stash.get(ref)
    metrics.update(rollout_metrics(final))
    metrics.update(tool_metrics(final))
    if rt.pipeline.max_staleness:
        metrics.update(staleness(final, ctx.policy_version))
    metrics.update(rt.services.generator.step_metrics(ctx, final))
    version = rt.services.learner.version
    metrics["policy_version"] = float(version)
    metrics.update({f"time/{label}": seconds for label, seconds in clock.wall.items()})
    metrics["step_seconds"] = time.perf_counter() - started
    rt.record.hand_over(f"commit[step={step}]",
                        _commit_fn(rt, run_id, step, dict(metrics), version), ref, commit_call)
    return StepReport(step=step, metrics=metrics, rollouts=ref, cpu=dict(clock.cpu),
                      errors=tally(m for m in final.column(col.SCORE_ERROR).to_pylist()
                                   if scorer_failed(m)))


def _clocked(call: Call, clock: StageClock) -> Call:
    """``call`` that times each stage's own work (the label before ``[``) on ``clock``."""
    def timed_call(name: str, fn: Callable, *args: Any) -> Any:
        return call(name, clock.timed(name.split("[", 1)[0], fn), *args)
    return timed_call


# --------------------------------------------------------------------------- stage calls


def _augment_fn(rt: Runtime, ctx: StepContext, s: Augment) -> Callable:
    def fn(ref: TableRef) -> TableRef:
        return rt.stash.put(key(ctx, s.label), s.augment(ctx, rt.stash.get(ref)))
    return fn


def _train_fn(rt: Runtime, ctx: StepContext) -> Callable:
    """The learner's update on the kept rows; a synchronous run's generator loads the
    new weights at once, an asynchronous one's when it draws the next batch ahead."""
    services = rt.services

    def fn(ref: TableRef) -> tuple[TableRef, dict[str, float]]:
        table = rt.stash.get(ref)
        kept = np.flatnonzero(table.column(col.KEPT).to_numpy(zero_copy_only=False))
        if len(kept) == 0:
            return ref, {"train/skipped": 1.0}
        with services.generator.asleep():
            result, handle = services.learner.update(ctx, table.take(kept))
        advantage = np.full(table.num_rows, np.nan)
        advantage[kept] = result.advantages
        consumed = np.full(table.num_rows, -1)
        consumed[kept] = ctx.step
        table = set_column(table, col.ADVANTAGE, pa.array(advantage, from_pandas=True))
        table = set_column(table, col.CONSUMED_AT_STEP,
                     pa.array(consumed, mask=consumed < 0, type=pa.int64()))
        if not rt.pipeline.max_staleness:
            services.generator.load(handle)
        metrics = {f"train/{k}": float(v) for k, v in result.metrics.items()}
        return rt.stash.put(key(ctx, "train"), table), metrics
    return fn


def _commit_fn(rt: Runtime, run_id: str, step: int, metrics: dict[str, float],
               policy_version: int) -> Callable:
    """The step's commit; takes the version and metrics as the step left them, since it
    may run while the next step trains (see Record.background)."""
    def fn(ref: TableRef) -> str:
        result = rt.record.commit(run_id, step, rt.stash.get(ref),  # type: ignore[misc]
                                  policy_version=policy_version, metrics=metrics)
        return result.message
    return fn
