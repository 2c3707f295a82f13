"""APRIL against synchronous generation on one policy, interleaved step by step in one
process: what bench/control.py measures on the tiny long-tail workload and bench/effects.py
on SmolLM2 (smol-long). Shared here so both measure the same way.

Per repeat, the two arms (:func:`arms`) run their steps alternately on the same weights
(no update: generation, scoring and the store's commit), the order alternating every
step, into one real store. An arm's figures: completed rollouts (status ``complete``:
those that reach the filters), the generate stage's time on every clock of
:data:`CLOCKS`, and each step's wall time. Partials still pending when the repeat ends
count as nothing (this favours the baseline).
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any, Callable

from gfcr import Pipeline
from gfcr.launch.run import MemoryStash
from gfcr.runner.inprocess import local_services
from gfcr.runner.loop import Runtime, run_step
from gfcr.runner.runtime import Record
from stages import (ActivePartialRollouts, GroupSample, RecyclePartials, UniformSampler,
                    Verify)
from stages.replay.recycle import recycle_counts
from store import LakeHistory, RolloutStore

OVER = 1.5
"""APRIL's over-provisioning: groups asked for per group trained on."""
CLOCKS = {"wall": time.perf_counter, "process": time.process_time}
"""The clocks every generate call is timed on (process: this process's CPU time, steadier
on a shared machine)."""


def arms(sample: GroupSample, batch: int) -> dict[str, list[Any]]:
    """The two stage lists: ``batch`` groups generated synchronously, and APRIL asking for
    ``OVER`` times as many and stopping once ``batch`` are complete (the stopped ones are
    continued first next step)."""
    return {"sync": [UniformSampler(batch=batch), sample, Verify()],
            "april": [RecyclePartials(), UniformSampler(batch=math.ceil(batch * OVER)),
                      ActivePartialRollouts(over_provision=OVER), sample, Verify()]}


def _runtime(p: Pipeline, store: RolloutStore, run_id: str, policy: Any) -> Runtime:
    """The loop's runtime for ``p`` on a shared, already warm-started policy."""
    store.start_run(run_id, pipeline=p.name, spec_yaml=p.to_yaml(), spec_hash=p.spec_hash(),
                    code_version="bench")

    def history(step: int) -> LakeHistory:
        return LakeHistory(store, run_id, as_of_step=step - 1) if step else LakeHistory(store, run_id)
    engine = p.engine.build(policy, seed=p.seed)
    return Runtime(pipeline=p, task=p.task, services=local_services(engine, policy, None),
                   stash=MemoryStash(),
                   record=Record(commit=store.commit_step, history_at=history))


def _timed(spent: dict[tuple[str, str], float], key: str) -> Callable[..., Any]:
    """An executor call that adds the generate stage's time, on every clock, to
    ``spent[clock, key]``."""
    def call(name: str, fn: Callable[..., Any], *args: Any) -> Any:
        t = {c: f() for c, f in CLOCKS.items()}
        out = fn(*args)
        if name.startswith("group["):
            for c, f in CLOCKS.items():
                spent[c, key] += f() - t[c]
        return out
    return call


def _tally(store: RolloutStore, run_id: str, last: int) -> dict[str, int]:
    row = store.sql("""
        WITH r AS (SELECT * FROM rollouts WHERE run_id = $run)
        SELECT count_if(status = 'complete') AS complete,
               count_if(status = 'pruned') + count_if(status = 'partial' AND step < $last
                   AND rollout_id NOT IN (SELECT parent_id FROM r WHERE parent_id IS NOT NULL))
                   AS discarded
        FROM r""", {"run": run_id, "last": last}).to_pylist()[0]
    return {k: int(v or 0) for k, v in row.items()}


def interleaved(policy: Any, pipelines: dict[str, Pipeline], where: Path, *, steps: int,
                repeat: int) -> dict[str, Any]:
    """Run ``pipelines`` (arm name -> pipeline) ``steps`` steps each, alternately on
    ``policy``, into a store at ``where``. Per arm: ``complete`` and ``discarded``
    rollouts, ``seconds`` (the generate stage's, per clock) and ``step_seconds`` (each
    step's wall time); ``lineage``: APRIL's recycle counts (stages.replay.recycle)."""
    names = list(pipelines)
    spent = {(c, k): 0.0 for c in CLOCKS for k in names}
    step_seconds: dict[str, list[float]] = {k: [] for k in names}
    with RolloutStore.open(where) as store:
        rts = {k: _runtime(p, store, f"{k}-{repeat}", policy) for k, p in pipelines.items()}
        for step in range(steps):
            for k in names if (step + repeat) % 2 == 0 else names[::-1]:
                started = time.perf_counter()
                run_step(rts[k], f"{k}-{repeat}", step, _timed(spent, k))
                step_seconds[k].append(time.perf_counter() - started)
        tally = {k: _tally(store, f"{k}-{repeat}", steps - 1) for k in names}
        lineage = recycle_counts(store, f"april-{repeat}") if "april" in names else {}
    return {"arms": {k: {**tally[k], "seconds": {c: spent[c, k] for c in CLOCKS},
                         "step_seconds": step_seconds[k]} for k in names},
            "lineage": lineage}


def rates(result: dict[str, Any]) -> dict[tuple[str, str], float]:
    """Completed rollouts per second of generation, per (clock, arm), of one
    :func:`interleaved` result."""
    return {(c, k): a["complete"] / a["seconds"][c]
            for k, a in result["arms"].items() for c in CLOCKS}
