"""A discrete-event model of one trainer and W GPU engine servers (bench/scale.py).

Each step's batch is split into W shares, one per server (gfcr.transport.fleet splits a step's
requests across its servers by group; the Prefect engine-worker path this model first
described sent a step's whole batch to one worker, so its 64-worker figures modelled a
dispatcher that did not exist). A fleet sends every request at once: its ``delay_s`` is
0, its ``dispatch_s`` one request's round trip, and the run process's CPU for all of a
step's requests (``requests_s`` each) overlaps generation but bounds it from below.

Engine workers submitted their tasks one after another on the run's thread
(``delay_s`` each, measured: ``.delay()``), and a task reaches its worker after the rest
of the measured round trip (``dispatch_s - delay_s``). A worker first loads the weights
version its task names if it holds an older one (all workers load together, sharing the
storage's read bandwidth), then generates its share. The trainer trains once the whole
batch is in and the previous step's commit is done, publishes the new weights (written
once), and hands the step's commit (``commit_s``, measured) to a background committer.
With staleness k, step t's batch is sent when step t-k starts (weights t-k).

Compute times are those of a real model: a 7B policy in bf16 (14 GB of weights), 40 s of
generation per worker at 64 workers (2560 worker-seconds a step) and 20 s of training,
so a step takes one minute at 64 workers when the control plane costs nothing. Storage
bandwidths are assumptions (stated in :class:`Costs`), not measurements of this machine.
Weights by NCCL broadcast are modelled as ``write_gb_s`` = the broadcast's bandwidth (the
trainer's send is the version's cost; a pipelined broadcast reaches every server in
about the time of one link) and unbounded reads (the servers receive as it is sent).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

WORKERS = (1, 2, 4, 8, 16, 32, 64)


@dataclass(frozen=True)
class Costs:
    dispatch_s: float
    """Measured: a task's round trip on the run side minus the worker's own time."""
    delay_s: float
    """Measured: the run thread's time in ``.delay()`` per task (serial)."""
    commit_s: float
    """Measured: one step's DuckLake commit."""
    weights_gb: float = 14.0
    write_gb_s: float = 2.0
    """Assumed: the trainer's write bandwidth to shared storage."""
    read_gb_s: float = 2.0
    """Assumed: one worker's read bandwidth from shared storage."""
    read_total_gb_s: float = 25.0
    """Assumed: the shared storage's total read bandwidth."""
    requests_s: float = 0.0
    """Measured: the run process's CPU per generate request (a fleet sends one request
    per rollout from a thread pool, so this overlaps generation but bounds the step from
    below: all of a step's requests go through one process)."""
    version_s: float = 0.0
    """Measured: a version's fixed cost on the trainer's path besides moving the bytes
    (a fleet's reload round: RPCs, prefix-cache reset, relabel)."""
    gen_worker_s: float = 2560.0
    """Generation of one step's batch on one worker (40 s each at 64 workers)."""
    train_s: float = 20.0
    rollouts_per_step: int = 4096


def simulate(c: Costs, workers: int, k: int, steps: int = 40) -> float:
    """Seconds per step in the steady state (the second half of ``steps`` steps)."""
    latency = max(c.dispatch_s - c.delay_s, 0.0)
    load = c.weights_gb / min(c.read_gb_s, c.read_total_gb_s / workers) if c.weights_gb else 0.0
    publish = (c.weights_gb / c.write_gb_s if c.weights_gb else 0.0) + c.version_s
    client = c.requests_s * c.rollouts_per_step
    share = c.gen_worker_s / workers
    published = [0.0]  # time version v is published (version 0 at the start)
    held = [-1] * workers  # the version each worker holds
    free = [0.0] * workers
    run_free, trainer_free, committed, done = 0.0, 0.0, 0.0, []
    for t in range(steps):
        version = max(t - k, 0)
        send = published[version]
        finish = 0.0
        for i in range(workers):
            run_free = max(run_free, send) + c.delay_s
            start = max(run_free + latency, free[i])
            if held[i] < version:
                start, held[i] = start + load, version
            free[i] = start + share
            finish = max(finish, free[i])
        finish = max(finish, send + client)  # one process sends every request
        done.append(finish)
        trained = max(finish, trainer_free, committed) + c.train_s
        trainer_free = trained + publish
        published.append(trainer_free)
        committed = max(committed, trained) + c.commit_s
    half = steps // 2
    return (published[-1] - published[half]) / (steps - half)


def _bound(c: Costs, workers: int, k: int, step: float) -> str:
    """The control-plane part whose removal shortens the step most ("compute" if none
    saves 1%)."""
    parts = {"dispatch": replace(c, dispatch_s=0.0, delay_s=0.0),
             "requests": replace(c, requests_s=0.0), "commit": replace(c, commit_s=0.0),
             "weights": replace(c, weights_gb=0.0, version_s=0.0)}
    saved = {name: step - simulate(free, workers, k) for name, free in parts.items()}
    name = max(saved, key=lambda n: saved[n])
    return name if saved[name] > 0.01 * step else "compute"


def model_table(c: Costs) -> tuple[list[dict[str, Any]], float]:
    """Rows per (workers, k) and the control plane's share of a 64-worker synchronous step."""
    ideal = replace(c, dispatch_s=0.0, delay_s=0.0, commit_s=0.0, weights_gb=0.0,
                    requests_s=0.0, version_s=0.0)
    rows = []
    for k in (0, 1, 2):
        for w in WORKERS:
            step = simulate(c, w, k)
            share = 1.0 - simulate(ideal, w, k) / step
            rows.append({"workers": w, "k": k, "step_s": step,
                         "rollouts_per_s": c.rollouts_per_step / step, "control_share": share,
                         "bound": _bound(c, w, k, step)})
    share64 = next(r["control_share"] for r in rows if r["workers"] == 64 and r["k"] == 0)
    return rows, share64
