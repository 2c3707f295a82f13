"""The fault drills beside bench/drill.py's kill -9 drill: stop (SIGINT), a full disk,
and takeover (a second ``--resume`` racing a live run; a frozen run whose lease a resume
took over, then continued). Each one ends with a last ``--resume`` to the end, and
bench/drill.py checks the store against the uninterrupted baseline.

Loaded by path from bench/drill.py (``bench/`` is taken off ``sys.path`` because
bench/store.py would shadow the ``store`` package); ``h`` is that module, for its helpers.
"""

from __future__ import annotations

import random
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any


def stop(h: Any, pipeline: Path, root: Path, steps: int, rng: random.Random,
         stops: int = 2) -> list[dict[str, Any]]:
    """SIGINT at a random committed step (the run stops at the next step boundary,
    checkpointed, exit 130), then ``--resume``; ``stops`` times, then to the end."""
    log: list[dict[str, Any]] = []
    run_id: str | None = None
    while len(log) < stops:
        last = h._last_step(root) if run_id else None
        first = 0 if last is None else last + 1
        if first > steps - 2:
            break
        target = rng.randint(first, steps - 2)
        proc = h._start(pipeline, root, run_id, False)
        if h._wait(proc, lambda: h._committed(root) >= target):
            h._finish(proc)
            return log
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=900)
        run_id = run_id or h._run_id(root)
        log.append({"target": f"after step {target}", "exit": proc.returncode,
                    "status": _status(h, root), "last_step": h._last_step(root)})
    h._finish(h._start(pipeline, root, run_id or h._run_id(root), False))
    return log


def disk_full(h: Any, pipeline: Path, root: Path, baseline: Path) -> list[dict[str, Any]]:
    """The run's root on a tmpfs of 60% of the baseline root's size (an unprivileged
    mount namespace: ``unshare -Urm``), so the disk fills partway; what the full disk
    holds when the run stops is copied out (space freed), and ``--resume`` ends it."""
    if shutil.which("unshare") is None or subprocess.run(
            ["unshare", "-Urm", "true"], capture_output=True).returncode != 0:
        return [{"skipped": "no unprivileged mount namespace (unshare -Urm)"}]
    size = max(400_000, int(0.6 * _bytes(baseline)))
    mount = root.with_name(root.name + "-tmpfs")
    mount.mkdir()
    root.mkdir()
    script = (f'mount -t tmpfs -o size={size} tmpfs "{mount}" || exit 99; "$@"; rc=$?; '
              f'cp -a "{mount}/." "{root}/"; exit $rc')
    proc = h._start(pipeline, mount, None, False, prefix=("unshare", "-Urm", "sh", "-c", script, "sh"))
    _, err = proc.communicate(timeout=1800)
    message = [line for line in err.decode(errors="replace").splitlines() if "error" in line]
    entry = {"tmpfs_bytes": size, "exit": proc.returncode, "message": " ".join(message)[:300],
             "last_step": h._last_step(root) if h._run_id(root) else None}
    if proc.returncode != 0 and h._run_id(root):
        h._finish(h._start(pipeline, root, h._run_id(root), False))
    return [entry]


def takeover(h: Any, pipeline: Path, root: Path, steps: int, rng: random.Random
             ) -> list[dict[str, Any]]:
    """The live run frozen (SIGSTOP) past its lease at a random committed step; two
    ``--resume`` of it started together race for the lease (one takes it over, the other
    is refused, exit 2, or, started after the winner ended, replays the end); the frozen
    run is continued (SIGCONT) once one holds the lease: it must stop (non-zero) without
    writing. A last ``--resume`` runs the run to the end if it did not finish."""
    env = {"GFCR_LEASE_SECONDS": "5"}
    live = h._start(pipeline, root, None, False, env=env)
    target = rng.randint(0, max(0, steps - 3))
    if h._wait(live, lambda: h._committed(root) >= target):
        h._finish(live)
        return [{"skipped": f"the run ended before step {target}'s commit was seen"}]
    live.send_signal(signal.SIGSTOP)
    time.sleep(7)  # past its 5 s lease
    run_id = h._run_id(root)
    racers = [h._start(pipeline, root, run_id, False, env=env) for _ in range(2)]
    deadline = time.monotonic() + 900
    while (_holder(root) not in [r.pid for r in racers] and time.monotonic() < deadline
           and any(r.poll() is None for r in racers)):
        time.sleep(0.2)
    live.send_signal(signal.SIGCONT)
    _, err = live.communicate(timeout=900)
    entry: dict[str, Any] = {
        "frozen_at": f"after step {target}", "frozen_owner_exit": live.returncode,
        "stopped_on_lost_lease": "taken over by" in err.decode(errors="replace"),
        "status_when_it_stopped": _status(h, root)}
    for i, racer in enumerate(racers):
        _, rerr = racer.communicate(timeout=1800)
        entry[f"resume_{i}_exit"] = racer.returncode
        entry[f"resume_{i}_refused"] = "is already running" in rerr.decode(errors="replace")
    if _status(h, root) != "finished":
        h._finish(h._start(pipeline, root, run_id, False))
    return [entry]


def _status(h: Any, root: Path) -> str | None:
    from store import RolloutStore

    with RolloutStore.open(root / "store", read_only=True) as s:
        rows = s.sql("SELECT status FROM runs").column("status").to_pylist()
    return rows[0] if rows else None


def _holder(root: Path) -> int | None:
    """The pid holding the run's lease, read from ``leases.sqlite`` alone (opening the
    store here again would open its catalog in this process)."""
    import sqlite3

    path = root / "store" / "leases.sqlite"
    if not path.exists():
        return None
    try:
        with sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True) as db:
            row = db.execute("SELECT pid FROM gfcr_run_leases").fetchone()
    except sqlite3.Error:
        return None
    return int(row[0]) if row else None


def _bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


__all__ = ["disk_full", "stop", "takeover"]
