"""Training benchmark: GRPO learner throughput and peak memory, and where a default step's
time goes.

    .venv/bin/python bench/train.py                       # table
    .venv/bin/python bench/train.py --json                # one JSON object
    .venv/bin/python bench/train.py --device cuda --precision bf16

Figures:

- ``default_step_share``: a few steps of the default pipeline (``pipelines/default.py``,
  from its cached SFT warm start, trained here once if missing) run in-process through
  ``gfcr.runner.loop.run_step`` with a plain call per stage (no Prefect, store or tracking); each
  stage call is timed and booked to its kind: ``train`` (the GRPO update, with the
  engine's weight refresh), ``generate``, ``filter`` (Verify, DynamicSampling) and
  ``other`` (prompt selection and the loop's own work: the step time minus the stage
  calls). Fractions of the summed step time, first step left out (warm-up).
- Per model config, ``tokens_per_s``: training tokens (prompt + completion tokens of the
  rows the update trains on, i.e. what its forward and backward passes process) per
  second of ``GRPOLearner.update`` (advantages, loss masks, forward, backward, AdamW
  step), median over timed updates after one warm-up update. The batch is a real one: the
  table the last measured default step handed its learner (rewards from the task's
  verifier, flat groups dropped, so every row has a non-zero advantage), with the
  behaviour logprobs recomputed under the config's own weights so the rows are
  on-policy. The ~100M config trains on the batch's first 4 groups only (CPU time).
  ``peak_mem_mb``: on CPU, how far the peak resident set size of a fresh subprocess per
  config grows from just before the model is built to after its updates (weights,
  gradients, AdamW state, activations, allocator slack). The batch's behaviour logprobs
  are computed before that by a same-seed copy of the weights, which is then freed, and
  the peak is reset to the current RSS through Linux's ``/proc/self/clear_refs`` (else
  the imports' peak would hide a small model's). The peak is read as ``VmHWM`` from
  ``/proc/self/status``, not ``getrusage(RUSAGE_SELF).ru_maxrss``: on Linux that one
  also holds the parent's RSS at fork, which hid the default model's peak entirely
  (``ru_maxrss`` where there is no ``/proc``; the output names what was used). On CUDA,
  ``torch.cuda.max_memory_allocated``.
  ``state_mb`` is the floor: fp32 weights, gradients and AdamW's two moments.

Clocks: ``process`` (default on CPU) is this process's CPU time — steadier on a shared
machine, and with one torch thread (the default pipeline's engine setting, used here too)
it is the time the work itself took; with more threads it sums them. ``wall`` is used on
CUDA (after synchronising). Both are reported.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

_HERE = Path(__file__).resolve().parent
# run as a script, bench/ comes first on sys.path and bench/store.py would shadow the
# `store` package: take bench/ off
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import torch  # noqa: E402

from gfcr.core.loading import load  # noqa: E402
from gfcr.core.pipeline import Pipeline
from gfcr.core.rollout import col  # noqa: E402
from gfcr.runner.inprocess import local_services  # noqa: E402
from gfcr.runner.loop import Runtime, run_step  # noqa: E402
from gfcr.transport.stash import MemoryStash  # noqa: E402
from stages.engines.hf_sampling import batch_token_logprobs
from stages.engines.tiny import TinyLlama  # noqa: E402


@dataclass(frozen=True)
class Config:
    """A model to train: its policy, how many of the batch's groups it trains on (None:
    all) and how many updates are timed."""

    policy: TinyLlama
    groups: int | None
    updates: int


CONFIGS: dict[str, Config] = {
    "default": Config(TinyLlama(), groups=None, updates=10),
    # Llama's gated MLP has three matrices: intermediate 2560 gives 99M parameters
    # (GPT-2's 4x, 3072, would give 113M)
    "llama_100m": Config(TinyLlama(hidden_size=768, num_layers=12, num_heads=12,
                                   intermediate_size=2560), groups=4, updates=5),
}

CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter,
                                          "process": time.process_time}


def _now(device: str) -> dict[str, float]:
    """Both clocks, after the device's queued work is done."""
    if device == "cuda":
        torch.cuda.synchronize()
    return {name: clock() for name, clock in CLOCKS.items()}


# --------------------------------------------------------------------------- step share


class _Recording:
    """Wraps a learner: passes updates through and keeps the last batch it was given."""

    def __init__(self, learner: Any) -> None:
        self.learner, self.batch = learner, None

    def update(self, ctx: Any, batch: pa.Table) -> Any:
        self.batch = batch
        return self.learner.update(ctx, batch)


class _StageTimer:
    """The loop's ``call``: runs each stage call and books its time to the stage's kind."""

    def __init__(self, pipeline: Pipeline, clock: str) -> None:
        self.kinds = {s.label: s.kind for s in pipeline.stages}
        self.clock = CLOCKS[clock]
        self.seconds: dict[str, float] = {}

    def __call__(self, name: str, fn: Callable, *args: Any) -> Any:
        label = name.split("[", 1)[0]
        kind = self.kinds.get(label)
        if kind is None:
            raise ValueError(f"bench/train.py: stage call {name!r} names no stage of the "
                             f"pipeline (labels: {sorted(self.kinds)})")
        started = self.clock()
        out = fn(*args)
        self.seconds[kind] = self.seconds.get(kind, 0.0) + self.clock() - started
        return out


def _shares(per_kind: dict[str, float], total: float) -> dict[str, float]:
    """Fractions of ``total``: train, generate, filter and the rest (``other``)."""
    out = {k: per_kind.get(k, 0.0) / total for k in ("train", "generate", "filter")}
    out["other"] = max(0.0, 1.0 - sum(out.values()))
    return out


def default_step_share(pipeline: Pipeline, *, steps: int, cache: Path,
                       clock: str) -> tuple[dict[str, Any], pa.Table]:
    """Run ``steps`` default steps in-process, time each stage call; returns the shares of
    steps 1.. (step 0 warms up) and the batch the last step's learner was given."""
    policy = pipeline.policy.build(seed=pipeline.seed)
    engine = pipeline.engine.build(policy, seed=pipeline.seed)  # sets CPU threads first
    if pipeline.warmstart is not None:
        pipeline.warmstart.run(policy, pipeline.task, seed=pipeline.seed, cache_dir=cache)
    learner = _Recording(pipeline.of_kind("train")[0].learner(policy, seed=pipeline.seed))
    rt = Runtime(pipeline=pipeline, task=pipeline.task,
                 services=local_services(engine, policy, learner), stash=MemoryStash())
    per_kind: dict[str, float] = {}
    total, rows = 0.0, []
    for step in range(steps):
        timer = _StageTimer(pipeline, clock)
        started = CLOCKS[clock]()
        report = run_step(rt, "bench-train", step, timer)
        if step == 0:
            continue
        total += CLOCKS[clock]() - started
        rows.append(report.metrics.get("train/n_seqs", 0.0))
        for kind, seconds in timer.seconds.items():
            per_kind[kind] = per_kind.get(kind, 0.0) + seconds
    if learner.batch is None:
        raise RuntimeError("bench/train.py: the default steps never reached the learner "
                           "(every group was dropped); no batch to train on")
    share = _shares(per_kind, total)
    share.update(step_s=total / (steps - 1), steps=steps - 1, clock=clock,
                 trained_rows_per_step=float(np.mean(rows)))
    return share, learner.batch


# --------------------------------------------------------------------------- one config


def _subset(batch: pa.Table, groups: int | None) -> pa.Table:
    """The rows of the batch's first ``groups`` groups (all rows for None)."""
    if groups is None:
        return batch
    ids = batch.column(col.GROUP_ID).to_pylist()
    chosen = list(dict.fromkeys(ids))[:groups]
    return batch.take([i for i, g in enumerate(ids) if g in chosen])


def _on_policy(batch: pa.Table, policy: Any) -> pa.Table:
    """``batch`` with its behaviour logprobs recomputed under ``policy``'s weights (at
    temperature 1, the default's sampling temperature) and its rows marked as generated
    by the current version, so no off-policy correction runs."""
    prompts = batch.column(col.PROMPT_IDS).to_pylist()
    completions = batch.column(col.COMPLETION_IDS).to_pylist()
    with torch.no_grad():
        lp, _ = batch_token_logprobs(policy.model, prompts, completions, 1.0,
                                     policy.tokenizer.pad_token_id)
    rows = [lp[i, :len(c)].float().cpu().tolist() for i, c in enumerate(completions)]
    version = pa.array([policy.version] * batch.num_rows, pa.int64())
    out = batch
    for name, values in ((col.LOGPROBS, pa.array(rows, pa.list_(pa.float32()))),
                         (col.POLICY_VERSION_START, version),
                         (col.POLICY_VERSION_END, version)):
        i = out.schema.get_field_index(name)
        out = out.set_column(i, out.schema.field(i), values)
    return out


def _trained_tokens(batch: pa.Table, advantages: list[float]) -> int:
    """Prompt + completion tokens of the rows an update trains on (A != 0)."""
    prompts = batch.column(col.PROMPT_IDS).to_pylist()
    completions = batch.column(col.COMPLETION_IDS).to_pylist()
    return sum(len(p) + len(c) for p, c, a in zip(prompts, completions, advantages)
               if a != 0.0 and c)


def _reset_peak_rss() -> bool:
    """Hand freed heap back to the OS (glibc's ``malloc_trim``, where there is one), then
    lower this process's peak RSS to its current RSS through Linux's
    ``/proc/self/clear_refs`` (value 5); False where that is refused. Without both, the
    imports' peak and their freed but resident heap hide a small model's training."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _peak_rss_kb() -> tuple[int, str]:
    """This process's peak RSS in KiB and where it was read: ``VmHWM`` of
    ``/proc/self/status`` on Linux, else ``ru_maxrss``. On Linux ``ru_maxrss`` is at least
    the RSS the parent had when it forked this process (kept across exec, and not reset
    by clear_refs), so under a parent bigger than a small model's peak it would not move;
    ``VmHWM`` is this process's own."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]), "VmHWM"
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "ru_maxrss"


def _peak_mb(device: str, baseline_kb: int, reset: bool) -> tuple[float, str]:
    """Peak memory of this process's training and how it was measured."""
    if device == "cuda":
        return torch.cuda.max_memory_allocated() / 2**20, "torch.cuda.max_memory_allocated"
    peak, source = _peak_rss_kb()
    since = ("the RSS before the model was built (peak reset there via /proc/self/"
             "clear_refs)" if reset else "the peak after imports")
    return (peak - baseline_kb) / 1024, (f"growth of peak RSS ({source}) over {since}, "
                                         "fresh subprocess per config")


def _built(config: Config, device: str) -> Any:
    """The config's policy on ``device`` (seed 0: every call gives the same weights)."""
    policy = config.policy.build(seed=0)
    policy.model.to(device)
    return policy


def _learner(policy: Any, precision: str) -> Any:
    """A learner with the default pipeline's GRPO settings at ``precision``."""
    spec = load("default").of_kind("train")[0]
    return spec.model_copy(update={"precision": precision}).learner(policy, seed=0)


def _prepared(config: Config, batch: pa.Table, *, device: str, precision: str) -> pa.Table:
    """The config's share of ``batch``, on-policy for its (seed-0) weights; then one
    update of a throwaway 1-layer model on it, which imports transformers' modelling code
    and initialises torch's kernels. Both are done, and their memory freed, before the
    measured training starts, so neither lands in its memory growth."""
    policy = _built(config, device)
    batch = _on_policy(_subset(batch, config.groups), policy)
    throwaway = _built(Config(TinyLlama(hidden_size=32, num_layers=1, num_heads=2,
                                        intermediate_size=64), None, 1), device)
    _learner(throwaway, precision).update(None, _subset(batch, 1))
    del policy, throwaway
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    return batch


def _timed_updates(learner: Any, batch: pa.Table, updates: int, device: str
                   ) -> tuple[list[dict[str, float]], dict[str, float]]:
    """One warm-up update, then ``updates`` timed ones: each one's seconds on both clocks,
    and the last one's metrics."""
    learner.update(None, batch)
    timings, metrics = [], {}
    for _ in range(updates):
        start = _now(device)
        result = learner.update(None, batch)
        end = _now(device)
        timings.append({k: end[k] - start[k] for k in end})
        metrics = dict(result.metrics,
                       trained_tokens=_trained_tokens(batch, result.advantages))
    return timings, metrics


def measure(name: str, batch: pa.Table, *, device: str, precision: str, clock: str,
            updates: int | None = None) -> dict[str, Any]:
    """Train config ``name`` on ``batch`` from fresh seed-0 weights: one warm-up update,
    then timed ones. Call it in a fresh process for a meaningful peak memory."""
    config = CONFIGS[name]
    batch = _prepared(config, batch, device=device, precision=precision)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    reset = device != "cuda" and _reset_peak_rss()
    baseline = _peak_rss_kb()[0]
    policy = _built(config, device)
    timings, metrics = _timed_updates(_learner(policy, precision), batch,
                                      updates or config.updates, device)
    peak, method = _peak_mb(device, baseline, reset)
    n_params = sum(p.numel() for p in policy.model.parameters())
    wall = statistics.median(t["wall"] for t in timings)
    cpu = statistics.median(t["process"] for t in timings)
    tokens = metrics["trained_tokens"]
    return {"params": n_params, "rows": int(metrics["n_seqs"]), "tokens_per_update": tokens,
            "tokens_per_s": tokens / (wall if clock == "wall" else cpu), "clock": clock,
            "wall_s_per_update": wall, "cpu_s_per_update": cpu, "peak_mem_mb": peak,
            "peak_mem_method": method, "state_mb": n_params * 16 / 2**20,
            "updates": len(timings), "device": device, "precision": precision,
            "threads": torch.get_num_threads()}


def _in_subprocess(name: str, batch_path: Path, args: argparse.Namespace) -> dict[str, Any]:
    """``measure`` of config ``name`` in a fresh interpreter (its own peak memory)."""
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", name,
               "--batch", str(batch_path), "--device", args.device,
               "--precision", args.precision, "--clock", args.clock,
               "--threads", str(args.threads)]
    if args.updates:
        command += ["--updates", str(args.updates)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"bench/train.py: config {name!r} failed in its subprocess "
                           f"(exit {done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------- output


def _print_table(configs: dict[str, dict], share: dict[str, Any]) -> None:
    headers = ["config", "params", "rows x tokens / update", "tokens/s", "s / update",
               "peak mem MB", "weights+grads+AdamW MB"]
    lines = [[name, f"{r['params'] / 1e6:.2f}M", f"{r['rows']} x {r['tokens_per_update']}",
              f"{r['tokens_per_s']:,.0f}",
              f"{r['cpu_s_per_update']:.3f} cpu / {r['wall_s_per_update']:.3f} wall",
              f"{r['peak_mem_mb']:,.0f}", f"{r['state_mb']:,.0f}"]
             for name, r in configs.items()]
    first = next(iter(configs.values()))
    print("GRPO learner updates (" + ", ".join(
        f"{k}={first[k]}" for k in ("device", "precision", "threads", "clock")) + ")")
    print(" | ".join(headers))
    for line in lines:
        print(" | ".join(line))
    print(f"peak memory: {first['peak_mem_method']}")
    print(f"default step ({share['step_s']:.2f} s {share['clock']} per step, "
          f"{share['steps']} steps, {share['trained_rows_per_step']:.0f} rows trained per "
          "step): " + ", ".join(f"{k} {share[k]:.1%}"
                               for k in ("train", "generate", "filter", "other")))


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="cuda needs a CUDA device torch can see")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                        help="GRPO's precision (bf16: autocast of the training forwards)")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default=None,
                        help="default: process on CPU, wall on CUDA")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads of the learner runs (the default pipeline's "
                             "engine sets 1)")
    parser.add_argument("--updates", type=int, default=None,
                        help="timed updates per config (default: 10, and 5 for llama_100m)")
    parser.add_argument("--share-steps", type=int, default=6,
                        help="default steps for the step share (the first is left out)")
    parser.add_argument("--cache", type=Path, default=Path(".gfcr/cache"),
                        help="where the default warm start is cached")
    parser.add_argument("--worker", choices=sorted(CONFIGS), help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device")
    if args.share_steps < 2:
        parser.error(f"--share-steps must be at least 2, got {args.share_steps!r}")
    args.clock = args.clock or ("wall" if args.device == "cuda" else "process")
    return args


def _worker(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    with pa.memory_map(str(args.batch)) as source:
        batch = pa.ipc.open_file(source).read_all()
    print(json.dumps(measure(args.worker, batch, device=args.device,
                             precision=args.precision, clock=args.clock,
                             updates=args.updates)))


def main(argv: list[str] | None = None) -> None:
    args = _arguments(argv)
    if args.worker:
        return _worker(args)
    pipeline = load("default").with_overrides(
        [f"steps={args.share_steps}", f"engine.device={args.device}",
         f"grpo.precision={args.precision}"])
    share, batch = default_step_share(pipeline, steps=args.share_steps, cache=args.cache,
                                      clock=args.clock)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "batch.arrow"
        with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, batch.schema) as w:
            w.write_table(batch)
        configs = {name: _in_subprocess(name, path, args) for name in CONFIGS}
    if args.json:
        print(json.dumps({**configs, "default_step_share": share}))
        return
    _print_table(configs, share)


if __name__ == "__main__":
    main()
