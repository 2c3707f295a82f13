"""The lease renewer of :mod:`store.lease`, in a process of its own.

A run renews its lease every fifth of its time to live. A thread of the run's process
cannot promise that: a scorer, a tokenizer or a user's stage computing in C without
letting go of the GIL stops every thread, and a lease that lapses under a live run lets a
``--resume`` take it over while the first run still writes. So the renewing is done by a
small child process (:mod:`gfcr.procs.childproc`: it imports only the lease database, and ends
with the run's process), which shares nothing with the run but the database:

- it renews on its own clock, and reports each renewal (``renewed``) to the run, which
  reads the reports when it checks its lease before a write (:meth:`Renewer.reports`);
- it is killed when the run releases the lease, and ends when the run's process has gone
  (the pipe from it ends, or it has a new parent), and when the lease is no longer this run's (it
  reports ``lost <holder>`` and ends: it never takes a lease back);
- a busy database is retried on the next tick, as before.
"""

from __future__ import annotations

import json
import os
import select
import time
from typing import Any

from gfcr.procs import childproc

from ._lease_db import open_db

class Renewer:
    """The run's handle on its renewer process."""

    def __init__(self, kind: str, target: str, *, renew_sql: str, owner_sql: str,
                 owner: str, interval: float) -> None:
        config = json.dumps({"kind": kind, "target": target, "renew": renew_sql,
                             "read": owner_sql, "owner": owner, "interval": interval})
        self.proc, self._control, self._reports = childproc.spawn_piped(
            "store._renewer", [config], lazy=("store", "stages"))
        os.set_blocking(self._reports, False)
        self._buffer = b""

    def alive(self) -> bool:
        return childproc.running(self.proc)

    def reports(self) -> list[str]:
        """The reports that came since the last call (``renewed``, ``lost <holder>``)."""
        while True:
            try:
                chunk = os.read(self._reports, 1 << 16)
            except (BlockingIOError, OSError):
                break
            if not chunk:
                break
            self._buffer += chunk
        *lines, self._buffer = self._buffer.split(b"\n")
        return [line.decode(errors="replace") for line in lines]

    def stop(self) -> None:
        """End the renewer at once. A renewal it had under way is one conditional
        statement: it lands whole or not at all, and only while this run owns the lease."""
        childproc.kill_piped(self.proc, self._control, self._reports)


def main(args: list[str]) -> None:
    """The renewer process (started by :class:`Renewer`)."""
    config, control, reports = json.loads(args[0]), int(args[1]), int(args[2])
    os.set_blocking(reports, False)
    parent, db = os.getppid(), None
    while _wait(control, float(config["interval"])) and os.getppid() == parent:
        try:
            db = db or open_db(config["kind"], config["target"])
            db.execute(config["renew"])
            rows = db.query(config["read"])
        except Exception:  # noqa: BLE001 - a busy or unreachable database: the next tick
            continue
        if not rows or rows[0][0] != config["owner"]:
            _report(reports, "lost " + (_describe(rows[0]) if rows else "nobody"))
            return
        _report(reports, "renewed")


def _wait(control: int, seconds: float) -> bool:
    """Wait ``seconds``; False when the run's end of the pipe has closed (it ended)."""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        if select.select([control], [], [], left)[0] and not os.read(control, 64):
            return False
    return True


def _describe(row: tuple[Any, ...]) -> str:
    return f"pid {row[2]} on host {row[1]!r}"


def _report(fd: int, line: str) -> None:
    """Tell the run; a run that has not read its reports for long misses some renewals,
    never the renewing itself (the write never blocks)."""
    try:
        os.write(fd, line.encode() + b"\n")
    except (BlockingIOError, BrokenPipeError):
        pass
