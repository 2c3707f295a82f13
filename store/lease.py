"""Run leases: one owner per run id, kept in the store's catalog database.

A run takes the lease of its run id before it writes anything and renews it from a
process of its own while it lives (:mod:`store._renewer`: a run's thread computing without
letting go of the GIL cannot stop it); a second process asking for the same run id (two
``--resume`` of one run) is refused, naming the holder (host and pid). A lease that has
lapsed (not renewed within its time to live), or whose holder is a process on this
machine that no longer exists, is stale: the next owner takes it over, and the run it
guarded is known to have crashed (``gfcr runs`` shows it so).

The lease table, ``gfcr_run_leases``, is not a lake table (renewals would be lake
snapshots). With a PostgreSQL catalog it sits in the catalog database beside DuckLake's
own tables, so the lease holds across hosts. A store folder keeps it in ``leases.sqlite``
beside ``catalog.sqlite``, not in it: Python's ``sqlite3`` and the SQLite library inside
DuckDB's extension are two copies of SQLite, and one closing the file releases the
other's POSIX locks, which corrupts a catalog being written (seen in testing). Every change is one conditional statement (insert if absent; update if the owner
is still the one read), so two processes never both believe they hold it; times are the
database's clock, so hosts need not agree on theirs.
"""

from __future__ import annotations

import os
import secrets
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ._duck import Catalog, quote_literal
from ._lease_db import Backend as _Backend
from ._lease_db import open_db
from ._renewer import Renewer

TABLE = "gfcr_run_leases"
LEASE_FILE = "leases.sqlite"
"""A store folder's lease database, beside its catalog."""
TTL_SECONDS = float(os.environ.get("GFCR_LEASE_SECONDS", "30"))
"""A lease not renewed for this long is stale (GFCR_LEASE_SECONDS); renewed every fifth."""

_CREATE = (f"CREATE TABLE IF NOT EXISTS {TABLE} (run_id TEXT PRIMARY KEY, owner TEXT NOT NULL, "
           "host TEXT NOT NULL, pid BIGINT NOT NULL, machine TEXT NOT NULL, "
           "proc_start TEXT NOT NULL, taken_at DOUBLE PRECISION NOT NULL, "
           "expires_at DOUBLE PRECISION NOT NULL)")
_COLUMNS = "run_id, owner, host, pid, machine, proc_start, taken_at, expires_at"


class LeaseHeld(RuntimeError):
    """The run is owned by a live process; the message names it."""


class LeaseLost(RuntimeError):
    """This process's lease was taken over (it had lapsed); the run must stop writing."""


@dataclass(frozen=True)
class Holder:
    """Who holds a lease: a random owner token, the host and process, and the machine
    (boot id and PID namespace: pids are comparable only within one)."""

    owner: str
    host: str
    pid: int
    machine: str
    proc_start: str

    def describe(self) -> str:
        return f"pid {self.pid} on host {self.host!r}"


@dataclass(frozen=True)
class LeaseRow:
    run_id: str
    holder: Holder
    taken_at: float
    expires_at: float
    now: float
    """The database's clock when the row was read."""

    def stale(self) -> str | None:
        """Why the lease no longer guards a live run, or None if it does."""
        if self.expires_at < self.now:
            return f"its lease lapsed {self.now - self.expires_at:.0f} s ago"
        if not _alive(self.holder):
            return f"its process ({self.holder.describe()}) no longer exists"
        return None


def me() -> Holder:
    """This process as a lease holder (a fresh owner token each call)."""
    return Holder(secrets.token_hex(8), socket.gethostname(), os.getpid(), _machine(),
                  _proc_start(os.getpid()) or "?")


# ------------------------------------------------------------------ the database


def _where(catalog: Catalog) -> tuple[str, str]:
    """The lease database of ``catalog``: its kind and its file or connection string."""
    if catalog.kind == "sqlite":
        return "sqlite", str(Path(catalog.target).with_name(LEASE_FILE))
    return catalog.kind, catalog.target


def _backend(catalog: Catalog, read_only: bool = False) -> _Backend:
    return open_db(*_where(catalog), read_only=read_only)


def _rows(db: _Backend, where: str = "") -> list[LeaseRow]:
    rows = db.query(f"SELECT {_COLUMNS}, {db.now} FROM {TABLE}{where}")
    return [LeaseRow(r[0], Holder(r[1], r[2], int(r[3]), r[4], r[5]), float(r[6]), float(r[7]),
                     float(r[8])) for r in rows]


def leases(catalog: Catalog) -> dict[str, LeaseRow]:
    """Every lease in the store's catalog, by run id (empty if none was ever taken)."""
    try:
        db = _backend(catalog, read_only=True)
    except Exception:  # noqa: BLE001 - an unreadable catalog has no leases to show
        return {}
    try:
        return {row.run_id: row for row in _rows(db)}
    except Exception:  # noqa: BLE001 - no lease table yet
        return {}
    finally:
        db.close()


# ------------------------------------------------------------------ taking a lease


class RunLease:
    """The lease of one run id, held by this process; see the module docstring."""

    def __init__(self, catalog: Catalog, run_id: str, *, ttl: float = TTL_SECONDS) -> None:
        self.run_id, self.ttl, self.holder = run_id, ttl, me()
        self.previous: LeaseRow | None = None
        """The stale lease this one took over (its run crashed), if any."""
        self.stale_reason: str | None = None
        self._where = _where(catalog)
        self._db = _backend(catalog)
        self._lock = threading.Lock()
        self._lost: str | None = None
        self._renewed = time.monotonic()
        self._renewer: Renewer | None = None
        self.renewals = 0
        """Renewals the renewer process reported (read when the lease is checked)."""

    def _q(self, value: str) -> str:
        return quote_literal(value)

    def acquire(self) -> RunLease:
        """Take the lease (or raise LeaseHeld naming its live holder) and start renewing."""
        h, db = self.holder, self._db
        db.execute(_CREATE)
        db.execute(f"INSERT INTO {TABLE} ({_COLUMNS}) VALUES ({self._q(self.run_id)}, "
                   f"{self._q(h.owner)}, {self._q(h.host)}, {h.pid}, {self._q(h.machine)}, "
                   f"{self._q(h.proc_start)}, {db.now}, {db.now} + {self.ttl}) "
                   "ON CONFLICT (run_id) DO NOTHING")
        row = self._row()
        if row is not None and row.holder.owner != h.owner:
            why = row.stale()
            if why is None:
                raise LeaseHeld(self._held_message(row))
            self._take_over(row)
            self.previous, self.stale_reason = row, why
        self._renewed = time.monotonic()
        self._renewer = self._start_renewer()
        return self

    def _start_renewer(self) -> Renewer:
        db, h = self._db, self.holder
        where = f"WHERE run_id = {self._q(self.run_id)}"
        return Renewer(*self._where, owner=h.owner, interval=self.ttl / 5,
                       renew_sql=f"UPDATE {TABLE} SET expires_at = {db.now} + {self.ttl} "
                                 f"{where} AND owner = {self._q(h.owner)}",
                       owner_sql=f"SELECT owner, host, pid FROM {TABLE} {where}")

    def _take_over(self, row: LeaseRow) -> None:
        h, db = self.holder, self._db
        db.execute(f"UPDATE {TABLE} SET owner = {self._q(h.owner)}, host = {self._q(h.host)}, "
                   f"pid = {h.pid}, machine = {self._q(h.machine)}, "
                   f"proc_start = {self._q(h.proc_start)}, taken_at = {db.now}, "
                   f"expires_at = {db.now} + {self.ttl} WHERE run_id = {self._q(self.run_id)} "
                   f"AND owner = {self._q(row.holder.owner)}")
        now = self._row()
        if now is None or now.holder.owner != h.owner:  # another process was faster
            raise LeaseHeld(self._held_message(now) if now else
                            f"run {self.run_id!r}: its lease vanished while being taken over")

    def _held_message(self, row: LeaseRow) -> str:
        left = max(0.0, row.expires_at - row.now)
        return (f"run {self.run_id!r} is already running: {row.holder.describe()} holds its "
                f"lease (renewed until {left:.0f} s from now). Wait for it to end, or stop "
                f"that process; a lease it stops renewing lapses after {self.ttl:.0f} s")

    def _row(self) -> LeaseRow | None:
        rows = _rows(self._db, f" WHERE run_id = {self._q(self.run_id)}")
        return rows[0] if rows else None

    # -------------------------------------------------------------- while the run lives

    def renew(self) -> None:
        """Extend the lease by its time to live; raises LeaseLost if another took it."""
        with self._lock:
            if self._lost:
                raise LeaseLost(self._lost)
            db = self._db
            db.execute(f"UPDATE {TABLE} SET expires_at = {db.now} + {self.ttl} "
                       f"WHERE run_id = {self._q(self.run_id)} AND owner = {self._q(self.holder.owner)}")
            row = self._row()
            if row is None or row.holder.owner != self.holder.owner:
                self._lost = self._lost_to(row.holder.describe() if row else "nobody")
                raise LeaseLost(self._lost)
            self._renewed = time.monotonic()

    def _lost_to(self, who: str) -> str:
        return (f"run {self.run_id!r}: this process's lease lapsed and was taken over by "
                f"{who}; it stops writing")

    def check(self) -> None:
        """Raise LeaseLost unless this process still holds the lease (renewing it first
        when the last renewal is old): called before each write of the run."""
        self._read_reports()
        if self._lost:
            raise LeaseLost(self._lost)
        if time.monotonic() - self._renewed > self.ttl / 2:
            self.renew()

    def _read_reports(self) -> None:
        """Take in what the renewer reported; start a new one if it died."""
        renewer = self._renewer
        if renewer is None:
            return
        for line in renewer.reports():
            if line == "renewed":
                self.renewals += 1
                self._renewed = time.monotonic()
            elif line.startswith("lost "):
                self._lost = self._lost or self._lost_to(line[len("lost "):])
        if not renewer.alive() and not self._lost:
            renewer.stop()
            self._renewer = self._start_renewer()

    def stop_renewing(self) -> None:
        """Stop the renewer process (the lease stays held until it lapses)."""
        renewer, self._renewer = self._renewer, None
        if renewer is not None:
            renewer.stop()

    def release(self) -> None:
        """Stop renewing and give the lease up (if still held)."""
        self.stop_renewing()
        with self._lock:
            try:
                if not self._lost:
                    self._db.execute(f"DELETE FROM {TABLE} WHERE run_id = {self._q(self.run_id)} "
                                     f"AND owner = {self._q(self.holder.owner)}")
            finally:
                self._db.close()

    def guard(self, write: Callable[..., Any]) -> Callable[..., Any]:
        """``write`` that first checks the lease is still held."""
        def guarded(*args: Any, **kw: Any) -> Any:
            self.check()
            return write(*args, **kw)
        return guarded


@contextmanager
def hold(store: Any, run_id: str) -> Iterator[RunLease]:
    """Hold ``run_id``'s lease in ``store`` (an open read-write RolloutStore) while the
    block runs: the store's commits for that run check it first. Taking over a stale
    lease of a run the store shows running marks that run crashed, with why."""
    lease = RunLease(store.catalog, run_id).acquire()
    try:
        if lease.previous is not None:
            _mark_crashed(store, run_id, lease)
        store.set_guard(run_id, lease.check)
        yield lease
    finally:
        store.set_guard(run_id, None)
        lease.release()


def _mark_crashed(store: Any, run_id: str, lease: RunLease) -> None:
    rows = store.sql("SELECT status FROM runs WHERE run_id = ?", [run_id]).column("status")
    if rows.to_pylist() != ["running"] or lease.previous is None:
        return
    store.finish_run(run_id, "crashed", f"the process running it ("
                     f"{lease.previous.holder.describe()}) died: {lease.stale_reason}; found "
                     f"when {lease.holder.describe()} took its lease over")


# ------------------------------------------------------------------ is the holder alive?


def _machine() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        return f"{boot}/{os.stat('/proc/self/ns/pid').st_ino}"
    except OSError:
        return f"{socket.gethostname()}/unknown"


def _proc_start(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (None: no such process)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _alive(holder: Holder) -> bool:
    """Whether the holder may be alive: False only for a process on this machine that is
    gone (or whose pid now belongs to a process started later)."""
    if holder.machine != _machine() or holder.machine.endswith("/unknown"):
        return True
    start = _proc_start(holder.pid)
    return start is not None and (holder.proc_start == "?" or start == holder.proc_start)
