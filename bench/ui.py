"""Benchmark ``gfcr ui`` on a store of 1M rollouts in one run, against ``gfcr report``'s
reads of the same run in the same invocation.

1. ``first_view_s_1m``: a run page's first view: its HTML and the step series its charts
   draw first (``/runs/RUN`` + ``/api/series?source=steps&runs=RUN``); then
   ``full_series_s_1m``: the store's per-step aggregates the charts add (the report's,
   computed once per committed step count, then cached); baseline ``report_s_1m``: the
   report's reads of the run (``gfcr.report.load_runs``). Target < 1 s.
2. ``filter_s_1m``: a filtered page of rollouts with its reward histogram and count, the
   slowest of a few filters (one step dropped rows; a reward range over every step; a free
   text search; the second page of a step). Target < 0.3 s.
3. ``live_latency_s``: from a step's commit returning to the run page's live feed
   (``/events?run=RUN``) delivering its marker. Target < 2 s.
4. ``writer_slowdown``: a writer's median commit time (1,000 rows a step) while a user
   watches its run (the live feed open, two pages opened every second) over its median
   with nobody watching, alternating blocks (the view reads committed snapshots on its
   own connections; on 2 shared cores it still competes for CPU).

The store is generated with pyarrow straight into ``RolloutStore.commit_step`` (steps of
50,000 small rollouts; about a minute here); ``--store`` of an earlier run reuses it. Each figure is the median of 3 after a warm-up.

    python bench/ui.py [--rows 1000000] [--per-step 50000] [--store DIR] [--json]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402

from bench.store import median, rollouts  # noqa: E402
from gfcr.core.rollout import col  # noqa: E402
from store import RolloutStore  # noqa: E402

RUN = "ui-bench"
LIVE = "ui-bench-live"
"""The run the live latency commits steps to (the 1M run's steps stay as generated)."""
REASONS = ("zero_variance", "too long", "duplicate")


def step_rows(step: int, n: int, run: str = RUN) -> pa.Table:
    """``n`` small rollouts of ``run``'s ``step`` with a spread of rewards and dropped rows with reasons."""
    table = rollouts(run, step, n, prompt_tokens=8, completion_tokens=16, n_prompts=50_000, seed=step)
    rng = np.random.default_rng(step + 1000)
    reward = np.round(rng.beta(2, 3, n), 3)
    kept = rng.random(n) < 0.8
    reason = np.where(kept, None, np.array(REASONS, dtype=object)[rng.integers(0, 3, n)])
    for name, values in ((col.REWARD, pa.array(reward)), (col.KEPT, pa.array(kept)),
                         (col.DROPPED_BY, pa.array(np.where(kept, None, "filter"), pa.string())),
                         (col.DROP_REASON, pa.array(reason, pa.string()))):
        table = table.set_column(table.schema.get_field_index(name), table.schema.field(name), values)
    return table


def generate(path: Path, rows: int, per_step: int) -> tuple[RolloutStore, int]:
    """The store at ``path`` with the run's ``rows`` in steps of ``per_step``: a store
    generated before (``--store`` again) is reused as it is, its steps left untouched."""
    store = RolloutStore.open(path)
    steps = -(-rows // per_step)
    last = store.last_step(RUN)
    if last is not None and last >= steps - 1:
        return store, steps
    store.start_run(RUN, pipeline="bench", spec_yaml="name: bench\n", spec_hash="-", code_version="bench")
    for step in range(steps):
        n = min(per_step, rows - step * per_step)
        store.commit_step(RUN, step, step_rows(step, n), policy_version=step,
                          metrics={"reward_mean": 0.4, "step_seconds": 1.0})
    return store, steps


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=120) as r:
        if r.status != 200:
            raise RuntimeError(f"{url}: status {r.status}")
        return r.read()


def live_latency(base: str, store: RolloutStore, repeats: int = 5) -> float:
    """Median seconds from a commit of run LIVE returning to its marker arriving on the
    live feed."""
    got: list[tuple[float, bytes]] = []
    ready = threading.Event()
    store.start_run(LIVE, pipeline="bench", spec_yaml="name: bench\n", spec_hash="-", code_version="bench")
    last = store.last_step(LIVE)
    step = 0 if last is None else last + 1

    def listen() -> None:
        with urllib.request.urlopen(f"{base}/events?run={LIVE}", timeout=300) as r:
            for line in r:
                if line.startswith(b"data:"):
                    got.append((time.perf_counter(), line))
                    ready.set()
                    if len(got) > repeats:
                        return
    threading.Thread(target=listen, daemon=True).start()
    ready.wait(120)
    latencies = []
    for k in range(repeats):
        seen = len(got)
        store.commit_step(LIVE, step + k, step_rows(step + k, 1000, LIVE), policy_version=step + k, metrics={})
        done = time.perf_counter()
        while len(got) == seen:
            time.sleep(0.01)
        latencies.append(got[seen][0] - done)
    return statistics.median(latencies)


def commit_seconds(store: RolloutStore, first: int, n: int) -> list[float]:
    """Seconds each of ``n`` commits of 1,000 rows to run LIVE takes, from step ``first``."""
    out = []
    for step in range(first, first + n):
        rows = step_rows(step, 1000, LIVE)
        start = time.perf_counter()
        store.commit_step(LIVE, step, rows, policy_version=step, metrics={})
        out.append(time.perf_counter() - start)
    return out


def writer_slowdown(base: str, store: RolloutStore, n: int = 8) -> float:
    """The writer's median commit time while a user watches run LIVE (its live feed open,
    a page opened every second) over its median with nobody watching, in alternating
    blocks of ``n`` commits each."""
    watching = threading.Event()

    def user() -> None:
        with urllib.request.urlopen(f"{base}/events?run={LIVE}", timeout=300) as feed:
            feed.readline()
            while watching.is_set():
                get(f"{base}/runs/{LIVE}")
                get(f"{base}/runs/{LIVE}/rollouts")
                time.sleep(1.0)
    step = (store.last_step(LIVE) or 0) + 1
    alone: list[float] = []
    watched: list[float] = []
    for _ in range(2):
        alone += commit_seconds(store, step, n)
        step += n
        watching.set()
        thread = threading.Thread(target=user, daemon=True)
        thread.start()
        time.sleep(1.0)
        watched += commit_seconds(store, step, n)
        step += n
        watching.clear()
        thread.join(60)
    return statistics.median(watched) / statistics.median(alone)


def start_server(folder: Path) -> tuple[subprocess.Popen[str], str]:
    """``gfcr ui`` on the store, in its own process as a user runs it; its base URL."""
    proc = subprocess.Popen([sys.executable, "-m", "gfcr.cli", "ui", "--store", str(folder), "--port", "0"],
                            stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    line = proc.stderr.readline()
    found = re.search(r"(http://\S+?)/?\s", line + " ")
    if not found:
        proc.kill()
        raise RuntimeError(f"gfcr ui printed {line!r}, not its URL")
    return proc, found.group(1).rstrip("/")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--per-step", type=int, default=50_000)
    parser.add_argument("--store", type=Path, default=None, help="Folder for the generated store.")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    folder = args.store or Path(tempfile.mkdtemp(prefix="gfcr-ui-bench-")) / "store"
    started = time.perf_counter()
    store, steps = generate(folder, args.rows, args.per_step)
    generate_s = time.perf_counter() - started
    from gfcr.report import load_runs, open_store

    with open_store(folder) as reader:
        report_s = median(lambda: load_runs(reader, [RUN]))
    server, base = start_server(folder)
    try:
        first = median(lambda: (get(f"{base}/runs/{RUN}"), get(f"{base}/api/series?source=steps&runs={RUN}")))
        start = time.perf_counter()
        get(f"{base}/api/series?runs={RUN}")  # computed once per committed step count, then cached
        full = time.perf_counter() - start
        last = steps - 1
        filters = {"dropped rows of a step": f"step={last}&kept=false",
                   "a reward range, every step": "reward_min=0.9&reward_max=1",
                   "free text": "q=abc", "second page of a step": f"step={last}&offset=50"}
        per_filter = {k: median(lambda q=q: get(f"{base}/runs/{RUN}/rollouts?{q}")) for k, q in filters.items()}
        latency = live_latency(base, store)
        slowdown = writer_slowdown(base, store)
    finally:
        server.terminate()
        server.wait(30)
        store.close()
    result = {"rows": args.rows, "steps": steps, "generate_s": generate_s, "report_s_1m": report_s,
              "first_view_s_1m": first, "full_series_s_1m": full, "filter_s_1m": max(per_filter.values()),
              "live_latency_s": latency, "writer_slowdown": slowdown, **{f"filter_s[{k}]": v for k, v in per_filter.items()}}
    if args.json:
        print(json.dumps(result))
        return
    print(f"{'figure':<44} {'seconds':>9}  target")
    for key, target in (("generate_s", ""), ("report_s_1m", "(baseline)"), ("first_view_s_1m", "< 1"),
                        ("full_series_s_1m", "(charts' store aggregates, once)"),
                        ("filter_s_1m", "< 0.3"), ("live_latency_s", "< 2"),
                        ("writer_slowdown", "(commit time watched / alone)")):
        print(f"{key:<44} {result[key]:>9.3f}  {target}")
    for k, v in per_filter.items():
        print(f"  filter: {k:<34} {v:>9.3f}")


if __name__ == "__main__":
    main()
