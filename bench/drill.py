"""Crash drill: kill -9 ``gfcr run`` at random points, ``--resume`` it, check the store.

A tiny pipeline (the test suite's 1-layer TinyLlama, 8 prompts x 8 samples a step,
``--steps`` steps, a checkpoint every ``--every`` steps so resumes also replay committed
steps) runs once uninterrupted as the baseline, which measures its start-up (process
start to the first step's commit) and its steps' time. Then the same pipeline runs
under a new root: ``gfcr run`` is started and killed with SIGKILL at a random point: in
start-up (a random share of the baseline's), or a random share of a step's time after a
randomly chosen step still to run was committed (so inside the next step, its commit or
a checkpoint), all along the run; it is started
again with ``--resume RUN_ID`` (each resume takes over the dead run's lease at once: its
pid is gone), ``--kills`` times; a last ``--resume`` runs to the end. The drill then checks, against the store:

- lost steps: steps of the run with no ``steps`` row (must be 0);
- duplicated steps: steps with more than one ``steps`` row, and rollout ids stored twice
  (must be 0);
- rollouts that differ from the baseline's (step, prompt, sample, completion, reward,
  kept), which on CPU with a fixed seed must be 0 too.

The other fault drills (``--drills``, all by default; bench/_faults.py) each run on a
root of their own and are checked the same way: ``stop`` (SIGINT at a random committed
step, twice, then resume), ``full`` (the root on a tmpfs of 60% of the baseline's size,
so the disk fills partway; what it held is copied out and the run resumed), ``takeover``
(second ``--resume`` racing the live run must be refused; then the live run frozen
past its lease, taken over by a resume, and continued: it must stop without writing).
Every drill counts lost rollouts (a baseline (step, prompt, sample) with no row) and
duplicated rollouts (a key or rollout id stored twice); the totals must be 0 and 0.

    .venv/bin/python bench/drill.py                 # 6 kills and the other drills, table
    .venv/bin/python bench/drill.py --kills 20 --drills kill --json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# Run as a script, this folder comes first on sys.path and bench/store.py would shadow
# the ``store`` package; drop that entry before anything imports it.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

PIPELINE = """
from gfcr import Evaluation, Pipeline
from stages import (GRPO, HF, DynamicSampling, GroupSample, ReasoningGym, TinyLlama,
                    UniformSampler, Verify)

pipeline = Pipeline(
    name="drill", seed=0, steps={steps},
    task=ReasoningGym(train_size=64, heldout_size=16),
    policy=TinyLlama(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64),
    engine=HF(device="cpu"),
    stages=[UniformSampler(batch=8), GroupSample(n=8, max_tokens=8), Verify(),
            DynamicSampling(), GRPO(lr=1e-3)],
    evaluation=Evaluation(size=8, max_tokens=6),
    checkpoint={{"every": {every}}},
)
"""
COMPARED = "step, prompt_id, sample_idx, completion, reward, kept"


def _start(pipeline: Path, root: Path, run_id: str | None, track: bool, *,
           env: dict[str, str] | None = None, prefix: tuple[str, ...] = ()
           ) -> subprocess.Popen[bytes]:
    args = ["--resume", run_id] if run_id else [str(pipeline)]
    cmd = [sys.executable, "-m", "gfcr.cli", "run", *args, "--root", str(root),
           "--executor", "local", "--json", *([] if track else ["--no-track"])]
    return subprocess.Popen([*prefix, *cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, **(env or {})})


def _run_id(root: Path) -> str | None:
    from store import RolloutStore, StoreError

    if not (root / "store" / "catalog.sqlite").exists():
        return None
    try:
        with RolloutStore.open(root / "store", read_only=True) as s:
            ids = s.sql("SELECT run_id FROM runs").column("run_id").to_pylist()
    except StoreError:
        return None
    return ids[0] if ids else None


def _last_step(root: Path) -> int | None:
    from store import RolloutStore

    with RolloutStore.open(root / "store", read_only=True) as s:
        return s.sql("SELECT max(step) AS s FROM steps").column("s")[0].as_py()


def _finish(proc: subprocess.Popen[bytes]) -> None:
    out, err = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"gfcr run failed ({proc.returncode}):\n{err.decode()[-4000:]}")


def baseline(pipeline: Path, root: Path, track: bool) -> tuple[float, float]:
    """(start-up seconds: until step 0 is committed, seconds of the steps after it)."""
    started = time.perf_counter()
    proc = _start(pipeline, root, None, track)
    first = None
    while proc.poll() is None:
        if first is None and _run_id(root) and _last_step(root) is not None:
            first = time.perf_counter() - started
        time.sleep(0.2)
    _finish(proc)
    total = time.perf_counter() - started
    first = total if first is None else first
    return first, total - first


def drill(pipeline: Path, root: Path, kills: int, timing: tuple[float, float], steps: int,
          rng: random.Random, track: bool) -> list[dict[str, Any]]:
    """Kill and resume ``kills`` times; the run then ends with a last resume. Each kill
    picks a target: the start-up (one in four), or a step still to run, killed a random
    share of a step's time after that step's commit (so inside the next step, its commit
    or a checkpoint). Targets follow the store, not the clock, so a slow machine moves
    them no later."""
    log: list[dict[str, Any]] = []
    run_id: str | None = None
    step_s = timing[1] / max(1, steps - 1)
    while len(log) < kills:
        last = _last_step(root) if run_id else None
        proc = _start(pipeline, root, run_id, track)
        first = 0 if last is None else last + 1
        target = None if rng.random() < 0.25 or first >= steps - 1 else rng.randint(first, steps - 2)
        started = time.perf_counter()
        if target is None:
            finished = _wait(proc, lambda: time.perf_counter() - started
                             > rng.uniform(0.3, 1.0) * timing[0])
        else:
            finished = _wait(proc, lambda: _committed(root) >= target)
            if not finished:
                time.sleep(rng.uniform(0.0, 1.5) * step_s)
        if finished or proc.poll() is not None:
            _finish(proc)  # it finished before the kill: the drill ends early
            break
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
        run_id = run_id or _run_id(root)
        log.append({"after_s": round(time.perf_counter() - started, 1),
                    "target": "start-up" if target is None else f"after step {target}",
                    "step_before": last, "last_step": _last_step(root) if run_id else None})
    _finish(_start(pipeline, root, run_id or _run_id(root), track))
    return log


_READERS: dict[Path, Any] = {}


def _committed(root: Path) -> int:
    """The last committed step of the run under ``root`` (-1: none, or no store yet),
    through one read-only store kept open (it sees each new commit), so polling is
    quick next to a step."""
    from store import RolloutStore

    if root not in _READERS:
        if _run_id(root) is None:
            return -1
        _READERS[root] = RolloutStore.open(root / "store", read_only=True)
    last = _READERS[root].last_step(_READERS[root].sql("SELECT run_id FROM runs")
                                    .column("run_id")[0].as_py())
    return -1 if last is None else last


def _wait(proc: subprocess.Popen[bytes], ready: Any) -> bool:
    """Poll until ``ready()``; True if the process ended first."""
    while proc.poll() is None:
        if ready():
            return False
        time.sleep(0.1)
    return True


def check(root: Path, reference: Path, steps: int) -> dict[str, int]:
    from store import RolloutStore

    with RolloutStore.open(root / "store", read_only=True) as s:
        rows = s.sql("SELECT step, count(*) AS n FROM steps GROUP BY step").to_pylist()
        ids = s.sql("SELECT count(*) - count(DISTINCT rollout_id) AS d FROM rollouts").to_pylist()
        keys = s.sql("SELECT count(*) - count(DISTINCT (step, prompt_id, sample_idx)) AS d "
                     "FROM rollouts").to_pylist()
        got = s.sql(f"SELECT {COMPARED} FROM rollouts ORDER BY ALL").to_pylist()
        status = s.sql("SELECT status FROM runs").column("status").to_pylist()
    with RolloutStore.open(reference / "store", read_only=True) as s:
        want = s.sql(f"SELECT {COMPARED} FROM rollouts ORDER BY ALL").to_pylist()
    per_step = {r["step"]: r["n"] for r in rows}
    key = lambda r: (r["step"], r["prompt_id"], r["sample_idx"])  # noqa: E731
    lost = len({key(r) for r in want} - {key(r) for r in got})
    return {
        "lost_rollouts": lost,
        "duplicated_rollouts": max(ids[0]["d"], keys[0]["d"]),
        "lost_steps": sum(1 for k in range(steps) if k not in per_step),
        "duplicated_steps": sum(1 for n in per_step.values() if n > 1),
        "rollouts": len(got), "baseline_rollouts": len(want),
        "rollouts_differing": sum(1 for a, b in zip(got, want) if a != b) + abs(len(got) - len(want)),
        "runs_finished": status.count("finished"), "runs": len(status),
    }


DRILLS = ("kill", "stop", "full", "takeover")


def _total(drills: dict[str, Any], key: str) -> int | None:
    """The sum over the drills that stored something; None if one left an unreadable store."""
    if any(str(d.get("store", "")).startswith("unreadable") for d in drills.values()):
        return None
    return sum(d.get(key, 0) for d in drills.values())


def _checked(root: Path, reference: Path, steps: int) -> dict[str, Any]:
    """``check``, or why the store could not be read (a damaged catalog is a finding)."""
    if not (root / "store" / "catalog.sqlite").exists():
        return {"store": "none"}
    reader = _READERS.pop(root, None)
    if reader is not None:  # its SQLite view of the catalog can go stale (see BENCHMARKS.md)
        reader.close()
    try:
        return check(root, reference, steps)
    except Exception as exc:  # noqa: BLE001 - reported, and counted as a failed drill
        return {"store": f"unreadable: {exc}"[:400]}


def _faults() -> Any:
    """bench/_faults.py, loaded by path (see the sys.path note above)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("_faults", Path(__file__).with_name("_faults.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_drills(a: argparse.Namespace, work: Path) -> dict[str, Any]:
    """The baseline, then each drill asked for on a root of its own, each checked."""
    pipeline = work / "drill.py"
    pipeline.write_text(PIPELINE.format(steps=a.steps, every=a.every))
    started = time.perf_counter()
    timing = baseline(pipeline, work / "baseline", a.track)
    faults, this = _faults(), sys.modules[__name__]
    rng = random.Random(a.seed)
    drills: dict[str, Any] = {}
    for name in a.drills:
        began, root = time.perf_counter(), work / name
        if name == "kill":
            log = drill(pipeline, root, a.kills, timing, a.steps, rng, a.track)
        elif name == "stop":
            log = faults.stop(this, pipeline, root, a.steps, rng)
        elif name == "full":
            log = faults.disk_full(this, pipeline, root, work / "baseline")
        else:
            log = faults.takeover(this, pipeline, root, a.steps, rng)
        drills[name] = {**_checked(root, work / "baseline", a.steps),
                        "seconds": round(time.perf_counter() - began, 1), "log": log}
        print(json.dumps({name: drills[name]}, default=str), file=sys.stderr, flush=True)
    return {"steps": a.steps, "checkpoint_every": a.every,
            "baseline_startup_seconds": round(timing[0], 1),
            "baseline_steps_seconds": round(timing[1], 1),
            "lost_rollouts": _total(drills, "lost_rollouts"),
            "duplicated_rollouts": _total(drills, "duplicated_rollouts"),
            "drills": drills, "drill_seconds": round(time.perf_counter() - started, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=6)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--every", type=int, default=3, help="checkpoint every N steps")
    parser.add_argument("--seed", type=int, default=0, help="seeds the kill times")
    parser.add_argument("--track", action="store_true", help="track in MLflow too (kill drill)")
    parser.add_argument("--drills", type=lambda t: [d for d in t.split(",") if d],
                        default=list(DRILLS), help=f"comma-separated, of {','.join(DRILLS)}")
    parser.add_argument("--json", action="store_true")
    a = parser.parse_args()
    unknown = set(a.drills) - set(DRILLS)
    if unknown:
        parser.error(f"--drills: unknown {sorted(unknown)}; known: {', '.join(DRILLS)}")
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    with tempfile.TemporaryDirectory(prefix="gfcr-drill-") as tmp:
        result = run_drills(a, Path(tmp))
    if a.json:
        print(json.dumps(result, default=str))
        return
    _print(result)


def _print(result: dict[str, Any]) -> None:
    for key, value in result.items():
        if key != "drills":
            print(f"{key:26} {value}")
    for name, d in result["drills"].items():
        counts = {k: v for k, v in d.items() if k != "log"}
        print(f"\n[{name}] " + ", ".join(f"{k}={v}" for k, v in counts.items()))
        for entry in d["log"]:
            print("   ", entry)
    bad = [n for n, d in result["drills"].items()
           if d.get("lost_rollouts", 1) or d.get("duplicated_rollouts", 1)
           or d.get("lost_steps", 1) or d.get("duplicated_steps", 1)]
    print(f"\nlost rollouts {result['lost_rollouts']}, duplicated rollouts "
          f"{result['duplicated_rollouts']}: " + ("OK" if not bad else f"FAILED ({', '.join(bad)})"))


if __name__ == "__main__":
    main()
