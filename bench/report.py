"""Benchmark ``gfcr report`` and ``gfcr doctor`` on a 1M-rollout store.

The store is bench/store.py's synthetic history store: 1M rollouts (8-token prompts,
16-token completions with their ids and logprobs) committed in steps of 65,536, with
30% of them right. Times (median of 3, after a warm-up that also builds the DuckDB
extension links):

- ``report_s``: ``gfcr.report.write_report`` in this process (open the store read-only,
  every query, render, write the page) — the target is < 10 s on this machine;
- ``report_cli_s``: the ``gfcr report`` command in a fresh process (``python -m gfcr.cli``
  from this checkout), imports included;
- ``doctor_s``: ``gfcr.doctor.diagnose`` on the same run;
- ``prompt_history_s``: the store's ``prompt_history`` view over the same rows, the
  baseline measured in the same run (bench/store.py's ``history_query_s_1m``).

Each also as CPU seconds (``*_cpu_s``: the process's, DuckDB's threads and the CLI's
process included), which a machine shared with other work inflates less than wall time;
``load_average`` is the 1-minute load when the figures were taken.

    python bench/report.py [--rows 1000000] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

from store import RolloutStore  # noqa: E402  (the package, not bench/store.py)

PER_STEP = 65_536


def build(path: Path, total: int) -> str:
    """The synthetic store of bench/store.py's history benchmark; returns its run id."""
    from importlib import util

    spec = util.spec_from_file_location("bench_store", Path(__file__).with_name("store.py"))
    assert spec is not None and spec.loader is not None
    bench_store = util.module_from_spec(spec)
    spec.loader.exec_module(bench_store)
    with RolloutStore.open(path) as s:
        s.start_run("hist", pipeline="bench", spec_yaml="name: bench\n", spec_hash="-", code_version="bench")
        for step in range(-(-total // PER_STEP)):
            n = min(PER_STEP, total - step * PER_STEP)
            table = bench_store.rollouts("hist", step, n, prompt_tokens=8, completion_tokens=16,
                                         n_prompts=50_000, seed=step)
            s.commit_step("hist", step, table, policy_version=step,
                          metrics={"train/loss": 0.1, "time/group": 1.0, "step_seconds": 2.0})
        s.finish_run("hist", "finished")
    return "hist"


def _cpu() -> float:
    """CPU seconds of this process (DuckDB's threads included) and its finished children."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def _median(fn: Callable[[], Any], repeats: int = 3) -> tuple[float, float]:
    """Median wall and CPU seconds of ``fn`` over ``repeats`` calls after a warm-up."""
    fn()
    walls, cpus = [], []
    for _ in range(repeats):
        start, cpu = time.perf_counter(), _cpu()
        fn()
        walls.append(time.perf_counter() - start)
        cpus.append(_cpu() - cpu)
    return statistics.median(walls), statistics.median(cpus)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    from gfcr.doctor import diagnose
    from gfcr.report import write_report

    with tempfile.TemporaryDirectory(prefix="gfcr-bench-report-") as tmp:
        path = Path(tmp) / "store"
        start = time.perf_counter()
        run_id = build(path, args.rows)
        result: dict[str, Any] = {"rows": args.rows, "build_s": time.perf_counter() - start}
        page = Path(tmp) / "report.html"
        result["report_s"], result["report_cpu_s"] = _median(lambda: write_report(path, [run_id], page))
        result["page_kb"] = page.stat().st_size / 1024
        # `python -m gfcr.cli` from the checkout (not the installed `gfcr` script, which
        # may be another checkout's): the command as a user runs it, imports included
        result["report_cli_s"], result["report_cli_cpu_s"] = _median(lambda: subprocess.run(
            [sys.executable, "-m", "gfcr.cli", "report", run_id, "--store", str(path), "--out",
             str(page)], check=True, capture_output=True, cwd=Path(__file__).resolve().parents[1]))
        with RolloutStore.open(path, read_only=True) as s:
            result["doctor_s"], result["doctor_cpu_s"] = _median(lambda: diagnose(s, run_id))
            result["prompt_history_s"], result["prompt_history_cpu_s"] = _median(
                lambda: s.sql("SELECT * FROM prompt_history"))
        result["load_average"] = os.getloadavg()[0]
    if args.json:
        print(json.dumps(result))
        return
    print(f"{'metric':<22}{'value':>12}")
    for key, value in result.items():
        print(f"{key:<22}{value:>12.3f}" if isinstance(value, float) else f"{key:<22}{value!s:>12}")
    print(f"target: report_s < 10 s ({'ok' if result['report_s'] < 10 else 'MISSED'})", file=sys.stderr)


if __name__ == "__main__":
    main()
