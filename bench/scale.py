"""Scale-out on a fleet of vLLM's own servers (issue 24), measured, then modelled.

Measured in one run on this machine (two real vLLM CPU servers started with
``gfcr engine serve``, the tiny policy, 8 prompts x 8 samples of up to 48 tokens a step):

- rollouts per second over steps 1.. with the fleet's two servers, with one of them,
  and with the in-process vLLM engine, run before the servers start and after they
  stop (at most two vLLMs at a time on this shared machine), the mean of the two the
  baseline, since this machine's load drifts within a run;
- the per-request dispatch cost: the round trip of a one-token request (HTTP, vLLM's
  scheduling, one forward pass of the tiny model: an upper bound), and the run
  process's CPU per request when 64 go out at once (``time.process_time``: the servers
  are other processes);
- each version's publication (FileSync, run side) and the fleet's reload (every server's
  checked load through gfcr's gate, prefix-cache reset and relabel, concurrently);
- a DuckLake step commit.

Then the discrete-event model (:mod:`bench._scale_model`) of 1 to 64 GPU servers and one
trainer runs on those costs, with weights sent by NCCL broadcast: a version costs its
bytes over the broadcast bandwidth (``--nccl-json``: the ``gb_s`` of
bench/gpu/nccl_broadcast.py's llama-7b row when its backend was "nccl"; else the assumed
25 GB/s of one 200 Gb/s link, since a pipelined broadcast's time hardly grows with the
receivers) plus the measured reload round. Requests go out concurrently, so dispatch is
one round trip per step plus the run process's CPU for all of them.

    python -m bench.scale [--steps 5] [--json] [--nccl-json PATH] [--measured PATH]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from statistics import median
from typing import Any

from bench._scale_model import Costs, model_table

ASSUMED_BROADCAST_GB_S = 25.0


def _pipeline(steps: int) -> Any:
    from stages import GRPO, GroupSample, UniformSampler, Verify
    from tests.conftest import tiny_pipeline
    from tests.resources.vllm import VLLM_POLICY, vllm_engine_spec

    return tiny_pipeline(
        steps=steps, policy=VLLM_POLICY, engine=vllm_engine_spec(),
        stages=[UniformSampler(batch=8), GroupSample(n=8, max_tokens=48), Verify(),
                GRPO(lr=1e-2)]).with_overrides(["evaluation.size=4", "evaluation.max_tokens=4"])


def _run(root: Path, steps: int, urls: tuple[str, ...] | None,
         key: Path | None = None) -> dict[str, Any]:
    from gfcr import execute
    from gfcr.launch.placement import Placement
    from gfcr.transport.fleet import Fleet

    fleet = Fleet(urls=urls, key_file=str(key) if key else None) if urls else None
    summary = execute(_pipeline(steps), root=root, executor="local",
                      placement=Placement(generator=fleet))
    steady = summary.history[1:]
    rows = summary.rollouts * len(steady) / len(summary.history)
    out: dict[str, Any] = {"rollouts_per_s": rows / sum(m["step_seconds"] for m in steady),
                           "steps": steps}
    if urls:
        out["reload_s"] = [m["fleet/reload_s"] for m in summary.history
                           if m["fleet/reload_s"] > 0]
        out["publish_s"] = [m["fleet/publish_s"] for m in summary.history
                            if m["fleet/publish_s"] > 0]
    return out


def _dispatch(url: str, key: bytes, serial: int = 20, burst: int = 64) -> dict[str, float]:
    """A one-token request's round trip (median of ``serial``), and the run process's
    CPU per request for ``burst`` sent at once."""
    from stages.engines._fleet_client import Server

    server = Server(url, timeout_s=120, key=key)
    sampling = {"temperature": 1.0, "max_tokens": 1, "logprobs": 0}
    server.generate("warm", [5, 6, 7], sampling)
    walls = []
    for i in range(serial):
        started = time.perf_counter()
        server.generate(f"serial-{i}", [5, 6, 7, i % 200 + 3], sampling)
        walls.append(time.perf_counter() - started)
    with ThreadPoolExecutor(32) as pool:
        cpu, wall = time.process_time(), time.perf_counter()
        list(pool.map(lambda i: server.generate(f"burst-{i}", [5, 6, i % 200 + 3], sampling),
                      range(burst)))
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    server.close()
    return {"dispatch_s": median(walls), "requests_s": cpu / burst,
            "burst_wall_per_request_s": wall / burst}


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
    from gfcr.transport.remote.keys import new_key
    from stages.engines._vllm_run import save_policy
    from tests.resources import fleet
    from tests.resources.vllm import VLLM_POLICY

    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        before = _run(work / "local-before", steps, None)  # the load drifts: bracket it
        gc.collect()  # its vLLM goes before the servers start
        save_policy(VLLM_POLICY.build(seed=0), work / "model")
        started = time.perf_counter()
        key = new_key(work / "fleet.key")
        servers = [fleet.start(work / "model", work / f"server-{i}.log", key, work)
                   for i in range(2)]
        try:
            fleet.wait_healthy(servers)
            results["server_start_s"] = time.perf_counter() - started
            urls = tuple(s.url for s in servers)
            results["fleet2"] = _run(work / "fleet2", steps, urls, key)
            results["fleet1"] = _run(work / "fleet1", steps, urls[:1], key)
            results.update(_dispatch(urls[0], servers[0].key()))
        finally:
            for server in servers:
                server.kill()
        after = _run(work / "local", steps, None)
        results["in_process"] = {"rollouts_per_s": (before["rollouts_per_s"]
                                                    + after["rollouts_per_s"]) / 2,
                                 "before": before["rollouts_per_s"],
                                 "after": after["rollouts_per_s"], "steps": steps}
        results["commit_s"] = _commit_s(work / "local")
    return results


def _broadcast_gb_s(path: str | None) -> tuple[float, str]:
    """The modelled broadcast bandwidth and where it came from."""
    if path:
        report = json.loads(Path(path).read_text())
        rows = {r["model"]: r for r in report["models"]}
        if report["backend"] == "nccl" and "llama-7b" in rows:
            return float(rows["llama-7b"]["gb_s"]), f"measured ({report['device']})"
    return ASSUMED_BROADCAST_GB_S, "assumed (one 200 Gb/s link)"


def model(measured: dict[str, Any], broadcast_gb_s: float) -> dict[str, Any]:
    """The scale model on the measured costs with weights by NCCL broadcast."""
    reloads = measured["fleet2"]["reload_s"]
    costs = Costs(dispatch_s=measured["dispatch_s"], delay_s=0.0,
                  commit_s=measured["commit_s"], requests_s=measured["requests_s"],
                  version_s=median(reloads) if reloads else 0.0,
                  write_gb_s=broadcast_gb_s, read_gb_s=1e9, read_total_gb_s=1e9)
    rows, share64 = model_table(costs)
    # one request per group (vLLM's n = 8 samples) instead of one per rollout
    _, grouped = model_table(replace(costs, requests_s=costs.requests_s / 8))
    bound = next(r["bound"] for r in rows if r["workers"] == 64 and r["k"] == 0)
    return {"control_plane_share_64": share64, "bound_64": bound,
            "control_plane_share_64_grouped": grouped, "costs": costs.__dict__, "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--nccl-json", default=None,
                        help="bench/gpu/nccl_broadcast.py's output (default: assumed)")
    parser.add_argument("--measured", default=None,
                        help="a previous --json output: model its measurements again "
                             "(e.g. with --nccl-json) instead of measuring")
    args = parser.parse_args()
    if args.steps < 2 and not args.measured:
        parser.error(f"--steps {args.steps}: give at least 2 (rollouts per second are "
                     f"measured over steps 1..; step 0 warms up)")
    measured = (json.loads(Path(args.measured).read_text().splitlines()[-1])["measured"]
                if args.measured else measure(args.steps))
    gb_s, source = _broadcast_gb_s(args.nccl_json)
    modelled = model(measured, gb_s)
    base = measured["in_process"]["rollouts_per_s"]
    reloads = measured["fleet2"]["reload_s"]
    out = {"control_plane_share_64": modelled["control_plane_share_64"],
           "bound_64": modelled["bound_64"],
           "control_plane_share_64_grouped": modelled["control_plane_share_64_grouped"],
           "fleet_speedup_2": measured["fleet2"]["rollouts_per_s"]
           / measured["fleet1"]["rollouts_per_s"],
           "fleet1_vs_in_process": measured["fleet1"]["rollouts_per_s"] / base,
           "fleet2_vs_in_process": measured["fleet2"]["rollouts_per_s"] / base,
           "dispatch_s": measured["dispatch_s"], "requests_s": measured["requests_s"],
           "reload_s": median(reloads) if reloads else 0.0,
           "publish_s": median(measured["fleet2"]["publish_s"] or [0.0]),
           "broadcast_gb_s": gb_s, "broadcast_source": source,
           "measured": measured, "model": modelled, "load_avg": os.getloadavg()[0]}
    if args.json:
        print(json.dumps(out, default=float))
        return
    _print(out)


def _print(out: dict[str, Any]) -> None:
    m = out["measured"]
    if "before" in m["in_process"]:
        print(f"in-process before the fleet {m['in_process']['before']:.1f}, after "
              f"{m['in_process']['after']:.1f} rollouts/s (their mean is the baseline)\n")
    print("| setup | rollouts/s | vs in-process |\n|---|---|---|")
    for name in ("in_process", "fleet1", "fleet2"):
        rps = m[name]["rollouts_per_s"]
        print(f"| {name} | {rps:.1f} | {rps / m['in_process']['rollouts_per_s']:.2f} |")
    print(f"\nfleet speedup (2 servers over 1): {out['fleet_speedup_2']:.2f}; dispatch "
          f"{out['dispatch_s']:.4f} s per request round trip; run-side CPU "
          f"{out['requests_s'] * 1e3:.2f} ms per request; reload {out['reload_s']:.3f} s and "
          f"publish {out['publish_s']:.3f} s per version; commit {m['commit_s']:.3f} s; "
          f"servers healthy after {m['server_start_s']:.0f} s; load average "
          f"{out['load_avg']:.1f}")
    print(f"\nbroadcast {out['broadcast_gb_s']:.1f} GB/s ({out['broadcast_source']}); "
          f"control-plane share at 64 servers, k=0: {out['control_plane_share_64']:.1%} "
          f"(bound by {out['bound_64']}); one request per group: "
          f"{out['control_plane_share_64_grouped']:.1%}\n")
    print("| servers | k | step s | rollouts/s | control-plane share | bound by |")
    print("|---|---|---|---|---|---|")
    for r in out["model"]["rows"]:
        print(f"| {r['workers']} | {r['k']} | {r['step_s']:.1f} | {r['rollouts_per_s']:.1f} | "
              f"{r['control_share']:.1%} | {r['bound']} |")


if __name__ == "__main__":
    main()
