"""Run leases (store.lease): one owner per run id, stale leases taken over, in a store
folder's lease database and in a PostgreSQL catalog."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import time
from dataclasses import replace

import pytest

from store import RolloutStore
from store.lease import LeaseHeld, LeaseLost, RunLease, hold, leases
from tests.resources.procs import running
from tests.store.test_durability import pg_database  # noqa: F401 (fixture)


def _elsewhere(lease: RunLease) -> RunLease:
    """``lease`` as if held by a process on another machine (its pid means nothing here)."""
    lease.holder = replace(lease.holder, host="other-host", pid=4242, machine="other/1")
    return lease


def _exercise(store: RolloutStore) -> None:
    first = RunLease(store.catalog, "r").acquire()
    with pytest.raises(LeaseHeld, match=r"run 'r' is already running: pid \d+ on host"):
        RunLease(store.catalog, "r").acquire()
    RunLease(store.catalog, "other").acquire().release()  # other run ids are free
    first.renew()
    assert set(leases(store.catalog)) == {"r"}
    first.release()
    assert leases(store.catalog) == {}

    # a holder on another machine that stops renewing: refused until its lease lapses
    gone = _elsewhere(RunLease(store.catalog, "r")).acquire()
    gone.stop_renewing()  # as a holder whose host went away
    with pytest.raises(LeaseHeld, match="pid 4242 on host 'other-host'"):
        RunLease(store.catalog, "r").acquire()
    db = gone._db  # its time to live, passed: the lease lapsed a second ago
    db.execute(f"UPDATE gfcr_run_leases SET expires_at = {db.now} - 1 WHERE run_id = 'r'")
    taker = RunLease(store.catalog, "r").acquire()
    assert taker.previous is not None and taker.previous.holder.pid == 4242
    assert "lapsed" in (taker.stale_reason or "")
    with pytest.raises(LeaseLost, match="taken over by pid"):
        gone.renew()
    taker.release()
    gone.release()


def test_leases_in_a_store_folder(tmp_path):
    with RolloutStore.open(tmp_path / "s") as store:
        _exercise(store)
    assert (tmp_path / "s" / "leases.sqlite").exists()


@pytest.mark.postgres
def test_leases_in_a_postgres_catalog(pg_database, tmp_path):  # noqa: F811
    with RolloutStore.open(pg_database, data_path=tmp_path / "data") as store:
        _exercise(store)


def test_a_dead_local_holder_is_stale_at_once_and_its_run_marked_crashed(tmp_path):
    with RolloutStore.open(tmp_path / "s") as store:
        store.start_run("r", pipeline="p", spec_yaml="x", spec_hash="h", code_version="v")
        dead = RunLease(store.catalog, "r")
        dead.holder = replace(dead.holder, pid=2**22 + 7)  # no such process here
        dead.acquire()
        dead.stop_renewing()
        with hold(store, "r") as lease:
            assert "no longer exists" in (lease.stale_reason or "")
            row = store.sql("SELECT status, error FROM runs").to_pylist()[0]
            assert row["status"] == "crashed" and "died" in row["error"]
            store.start_run("r", pipeline="p", spec_yaml="x", spec_hash="h", code_version="v")
        assert store.sql("SELECT status, error FROM runs").to_pylist() == [
            {"status": "running", "error": None}]


def test_a_commit_after_the_lease_was_lost_is_refused(tmp_path):
    from tests.store.conftest import make_rollouts

    with RolloutStore.open(tmp_path / "s") as store:
        with hold(store, "r") as lease:
            lease._lost = "run 'r': taken over by pid 1 on host 'h'"
            with pytest.raises(LeaseLost, match="taken over"):
                store.commit_step("r", 0, make_rollouts(4, run_id="r"), policy_version=0,
                                  metrics={})
            lease._lost = None
        assert store.last_step("r") is None


_WATCH = """
import os, sqlite3, sys, time
con = sqlite3.connect(sys.argv[1], timeout=30)
read = "SELECT expires_at FROM gfcr_run_leases WHERE run_id = 'r'"
first, deadline, moved = con.execute(read).fetchone()[0], time.monotonic() + 60, False
while not moved and time.monotonic() < deadline:
    time.sleep(0.05)
    moved = con.execute(read).fetchone()[0] > first
os.write(int(sys.argv[2]), b"1" if moved else b"0")
"""


class _PollFd(ctypes.Structure):
    _fields_ = [("fd", ctypes.c_int), ("events", ctypes.c_short), ("revents", ctypes.c_short)]


def test_the_lease_is_renewed_while_the_runs_process_holds_the_gil(tmp_path):
    """A scorer, tokenizer or stage computing in C without letting go of the GIL
    (math-verify expanding 9^9^9^9) stops every thread of the run's process: the lease's
    renewer is not one of them. Here the run's thread holds the GIL in a C call (poll(2)
    through ctypes.PyDLL, which keeps it) until a watcher process has seen the lease's
    expiry move in the database, or 60 s have passed."""
    with RolloutStore.open(tmp_path / "s") as store:
        lease = RunLease(store.catalog, "r", ttl=1.0).acquire()
        try:
            read, write = os.pipe()
            watcher = subprocess.Popen([sys.executable, "-c", _WATCH,
                                        str(tmp_path / "s" / "leases.sqlite"), str(write)],
                                       pass_fds=(write,))
            os.close(write)
            waiting = _PollFd(read, 1, 0)  # POLLIN
            ctypes.PyDLL(None).poll(ctypes.byref(waiting), 1, 90_000)  # holds the GIL
            assert os.read(read, 1) == b"1", "the lease was not renewed while the GIL was held"
            watcher.wait()
            deadline = time.monotonic() + 60
            while lease.renewals == 0 and time.monotonic() < deadline:
                lease.check()  # reads the renewer's reports
                time.sleep(0.05)
            assert lease.renewals >= 1
        finally:
            lease.release()


_HOLD = """
import sys
from store import RolloutStore
from store.lease import RunLease
with RolloutStore.open(sys.argv[1]) as store:
    lease = RunLease(store.catalog, "r", ttl=1.0).acquire()
    print(lease._renewer.proc.pid, flush=True)
    sys.stdin.read()
"""


def test_the_renewer_ends_with_the_runs_process(tmp_path):
    """A renewer that outlived its run would keep a dead run's lease alive for ever (on a
    PostgreSQL catalog, where no other host can see that the pid is gone)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    run = subprocess.Popen([sys.executable, "-c", _HOLD, str(tmp_path / "s")], env=env,
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        renewer = int(run.stdout.readline())
        assert running(renewer)
    finally:
        run.kill()  # kill -9: no release, no atexit
        run.wait()
    deadline = time.monotonic() + 60
    while running(renewer) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not running(renewer)
