"""Scale-out: the generate stage on engine workers (issue 16), measured, then modelled.

Measured in one run on this machine (a real Prefect server subprocess, real
``gfcr engine-worker`` subprocesses, the tiny pipeline on the digits task after a short
supervised warm start):

- rollouts per second over steps 1.. (step 0 pays the workers' engine builds) and held-out
  accuracy after the warm start and after N steps, for in-process sync, then 1 and 2
  workers with k = 0 and k = 1;
- the per-task dispatch cost: a call's wall time on the run side minus the worker's own
  time (staging the plan, ``.delay()``, the task worker's pickup, the result's return);
- the weight publish time (run side) and load time (worker side) per step;
- a DuckLake step commit.

Then a discrete-event model (:mod:`bench._scale_model`) of 1 to 64 GPU engine workers and
one trainer, on those measured control-plane costs and on real-model step times, shows how
rollouts per second scale with workers and staleness and what bounds it first.

    python -m bench.scale [--steps 6] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from statistics import mean, median
from tempfile import TemporaryDirectory
from typing import Any, Iterator

from bench._scale_model import Costs, model_table

POOL = "bench-scale"
REPO = Path(__file__).resolve().parents[1]


def _pipeline(steps: int, k: int) -> Any:
    """The tiny policy on the digits task with a 4-step supervised warm start (half the
    held-out prompts answered) and GRPO at lr 1e-2: held-out accuracy moves within a few
    steps, so the setups' accuracy after N steps can be told apart from the warm start's."""
    from stages import GRPO, SFT, GroupSample, UniformSampler, Verify
    from tests.conftest import tiny_pipeline
    from tests.resources.digits import DigitAnswers

    return tiny_pipeline(
        steps=steps, task=DigitAnswers(), max_staleness=k,
        warmstart=SFT(steps=4, batch_size=12, schedule="constant"),
        stages=[UniformSampler(batch=8), GroupSample(n=8, max_tokens=4), Verify(),
                GRPO(lr=1e-2)]).with_overrides(["evaluation.max_tokens=4"])


@contextmanager
def _workers(n: int, logs: Path) -> Iterator[None]:
    from prefect.settings import get_current_settings

    from gfcr.remote.keys import KEY_ENV, new_key

    settings = get_current_settings()
    if not os.environ.get(KEY_ENV):  # the pool's key, for the run here and its workers
        os.environ[KEY_ENV] = str(new_key(logs / "pool.key"))
    env = {**os.environ, "PREFECT_API_URL": str(settings.api.url),
           "PREFECT_RESULTS_LOCAL_STORAGE_PATH": str(settings.results.local_storage_path)}
    procs = []
    for i in range(n):
        with open(logs / f"worker-{n}-{i}.log", "w") as log:
            procs.append(subprocess.Popen(
                [sys.executable, "-c", "from gfcr.cli import main; main()", "engine-worker",
                 "--pool", POOL, "--name", f"w{i}", "--import", "tests.resources.digits"],
                cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT))
    try:
        yield
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=30)


def _run(root: Path, steps: int, k: int, pool: str | None) -> dict[str, Any]:
    from gfcr import execute
    from gfcr.remote.dispatch import GeneratePool

    placement = None if pool is None else GeneratePool(pool=pool, timeout_s=600, warn_s=300)
    summary = execute(_pipeline(steps, k), root=root, executor="local",
                      generate_pool=placement)
    steady = summary.history[1:]
    rows = summary.rollouts * len(steady) / len(summary.history)
    out = {"rollouts_per_s": rows / sum(m["step_seconds"] for m in steady),
           "accuracy_warmstart": summary.accuracy_warmstart,
           "accuracy_after": summary.accuracy_after, "steps": steps}
    if pool is not None:
        calls = [m for m in steady if m.get("remote/wall_s")]
        out["dispatch_s"] = median(m["remote/wall_s"] - m["remote/worker_s"] for m in calls)
        out["delay_s"] = median(m["remote/delay_s"] for m in calls)
        published = [m["remote/publish_s"] for m in steady if m["remote/publish_s"] > 0]
        loaded = [m["remote/load_s"] for m in steady if m["remote/load_s"] > 0]
        out["publish_s"] = mean(published) if published else 0.0
        out["load_s"] = mean(loaded) if loaded else 0.0
        out["staleness_max"] = max(m["staleness/max"] for m in summary.history)
    return out


def _commit_s(root: Path, repeats: int = 5) -> float:
    """Median seconds of one step's DuckLake commit of a measured run's step-0 rollouts."""
    import pyarrow as pa

    from store import RolloutStore

    with RolloutStore.open(root / "store", read_only=True) as s:
        run_id = s.sql("SELECT run_id FROM runs").column("run_id")[0].as_py()
        table = s.sql(f"SELECT * FROM rollouts WHERE run_id = '{run_id}' AND step = 0")
    times = []
    with RolloutStore.open(root / "commits", create=True) as s:
        s.start_run("commits", pipeline="bench", spec_yaml="", spec_hash="", code_version="")
        for step in range(repeats):
            rows = table.set_column(table.schema.get_field_index("run_id"), "run_id",
                                    pa.array(["commits"] * table.num_rows))
            rows = rows.set_column(rows.schema.get_field_index("step"), "step",
                                   pa.array([step] * rows.num_rows, pa.int64()))
            started = time.perf_counter()
            s.commit_step("commits", step, rows, policy_version=0, metrics={})
            times.append(time.perf_counter() - started)
    return median(times)


def measure(steps: int) -> dict[str, Any]:
    from prefect.testing.utilities import prefect_test_harness

    results: dict[str, Any] = {}
    with TemporaryDirectory() as tmp, prefect_test_harness(server_startup_timeout=180):
        work = Path(tmp)
        results["in_process"] = _run(work / "local", steps, 0, None)
        results["commit_s"] = _commit_s(work / "local")
        for n in (1, 2):
            with _workers(n, work):
                for k in (0, 1):
                    results[f"workers{n}_k{k}"] = _run(work / f"w{n}k{k}", steps, k, POOL)
    return results


def _table(results: dict[str, Any]) -> str:
    base = results["in_process"]["rollouts_per_s"]
    lines = ["| setup | rollouts/s | vs in-process | held-out: warm start -> after | "
             "dispatch s | publish s | load s | max staleness |", "|---|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        if not isinstance(r, dict):
            continue
        lines.append(f"| {name} | {r['rollouts_per_s']:.2f} | {r['rollouts_per_s'] / base:.2f} "
                     f"| {r['accuracy_warmstart']:.3f} -> {r['accuracy_after']:.3f} | "
                     f"{r.get('dispatch_s', 0):.3f} | "
                     f"{r.get('publish_s', 0):.4f} | {r.get('load_s', 0):.4f} | "
                     f"{r.get('staleness_max', 0):.0f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    measured = measure(args.steps)
    two = (measured["workers2_k1"]["rollouts_per_s"] / measured["workers2_k0"]["rollouts_per_s"])
    dispatch = median(measured[f"workers{n}_k0"]["dispatch_s"] for n in (1, 2))
    costs = Costs(dispatch_s=dispatch, delay_s=measured["workers2_k0"]["delay_s"],
                  commit_s=measured["commit_s"])
    rows, share64 = model_table(costs)
    # what fixes the first bound: weights sent to every worker at its own bandwidth
    # (a broadcast or peer fan-out instead of one shared store), then also as bf16 deltas
    # a quarter the size
    _, broadcast = model_table(replace(costs, read_total_gb_s=1e9))
    _, deltas = model_table(replace(costs, read_total_gb_s=1e9, weights_gb=3.5))
    out = {"async_speedup": two, "dispatch_s": dispatch, "control_plane_share_64": share64,
           "control_plane_share_64_broadcast": broadcast,
           "control_plane_share_64_broadcast_deltas": deltas,
           "commit_s": measured["commit_s"], "measured": measured, "model": rows,
           "load_avg": os.getloadavg()[0]}
    if args.json:
        print(json.dumps(out, default=float))
        return
    print(_table(measured))
    print(f"\nasync speedup (2 workers, k=1 over k=0): {two:.2f}; dispatch {dispatch:.3f} s "
          f"per task; commit {measured['commit_s']:.3f} s; load average {out['load_avg']:.2f}\n")
    print(f"control-plane share at 64 workers, k=0: {share64:.1%}; weights by broadcast "
          f"{broadcast:.1%}; broadcast of deltas {deltas:.1%}\n")
    print("| workers | k | step s | rollouts/s | control-plane share | bound by |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['workers']} | {r['k']} | {r['step_s']:.1f} | {r['rollouts_per_s']:.1f} | "
              f"{r['control_share']:.1%} | {r['bound']} |")


if __name__ == "__main__":
    main()
