"""Stopping `gfcr run`: SIGTERM (or Ctrl-C) stops at a step boundary, checkpointed, ends
Cancelled in Prefect and `cancelled` in the store, and `--resume` completes the run with
every step stored exactly once; a second signal stops at once, keeping whole steps."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from gfcr.checkpoints import checkpoint
from tests.conftest import tiny_pipeline
from store import RolloutStore, StoreError

PIPELINE_FILE = """
from tests.conftest import tiny_pipeline
pipeline = tiny_pipeline(steps={steps})
"""
REPO = Path(__file__).resolve().parents[2]


def _start(tmp_path: Path, steps: int, *args: str, env: dict[str, str] | None = None):
    path = tmp_path / "tiny.py"
    path.write_text(PIPELINE_FILE.format(steps=steps))
    command = [sys.executable, "-m", "gfcr.cli", "run", str(path), "--root",
               str(tmp_path / "root"), "--no-track", *args]
    return subprocess.Popen(command, cwd=REPO, env={**os.environ, **(env or {})},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for_step(root: Path, step: int, child: subprocess.Popen, timeout: float = 300) -> str:
    """The run id, once the store holds ``step`` of the (only) run. The store is opened
    once and then polled (an open is slow on a busy machine; a reader sees new commits)."""
    deadline = time.monotonic() + timeout
    reader = None
    try:
        while time.monotonic() < deadline:
            assert child.poll() is None, child.communicate()
            try:
                reader = reader or RolloutStore.open(root / "store", read_only=True)
            except StoreError:  # not created yet, or being created
                time.sleep(0.1)
                continue
            rows = reader.sql("SELECT run_id, max(step) AS last FROM steps GROUP BY run_id").to_pylist()
            if rows and rows[0]["last"] >= step:
                return rows[0]["run_id"]
            time.sleep(0.05)
    finally:
        if reader is not None:
            reader.close()
    raise AssertionError(f"step {step} was not committed within {timeout} s")


def _stored(root: Path, run_id: str) -> tuple[str, list[int], int, int]:
    """(runs.status, the committed steps in order, rollout rows, distinct rollout ids)."""
    with RolloutStore.open(root / "store", read_only=True) as s:
        status = s.sql("SELECT status FROM runs WHERE run_id = ?", [run_id]).to_pylist()[0]["status"]
        steps = [r["step"] for r in s.sql("SELECT step FROM steps WHERE run_id = ? ORDER BY step",
                                          [run_id]).to_pylist()]
        counts = s.sql("SELECT count(*) AS n, count(DISTINCT rollout_id) AS ids FROM rollouts "
                       "WHERE run_id = ?", [run_id]).to_pylist()[0]
    return status, steps, counts["n"], counts["ids"]


def _flow_run_states(run_id: str) -> list[str]:
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName

    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(
            name=FlowRunFilterName(any_=[run_id])))
    return [r.state.type.value for r in runs if r.state is not None]


def test_sigterm_cancels_gfcr_run_at_a_step_boundary_and_resume_completes_it(
        tmp_path, prefect_server):
    from prefect.settings import PREFECT_API_URL

    env = {"PREFECT_API_URL": str(PREFECT_API_URL.value())}
    root = tmp_path / "root"
    # 40 steps, not fewer: on a loaded machine the poll has seen step 0 only after an
    # 8-step run had finished (CI, 2026-11-29), and then there is nothing left to stop
    total = 40
    child = _start(tmp_path, total, env=env)
    run_id = _wait_for_step(root, 0, child)
    child.send_signal(signal.SIGTERM)
    out, err = child.communicate(timeout=300)
    assert child.returncode == 130, err
    assert "cancelled" in err and f"--resume {run_id}" in err, err

    status, steps, rows, ids = _stored(root, run_id)
    assert status == "cancelled"
    last = steps[-1]
    assert steps == list(range(last + 1)) and last < total - 1 and rows == ids
    saved = checkpoint.latest(checkpoint.directory(root, run_id))
    assert saved is not None and saved.step == last  # the last whole step is checkpointed
    assert _flow_run_states(run_id) == ["CANCELLED"]

    resumed = _start(tmp_path, total, "--resume", run_id, env=env)
    out, err = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, err
    status, steps, rows, ids = _stored(root, run_id)
    assert status == "finished" and steps == list(range(total)) and rows == ids == total * 16
    assert sorted(_flow_run_states(run_id)) == ["CANCELLED", "COMPLETED"]


def test_a_second_sigint_stops_at_once_and_loses_no_committed_step(tmp_path):
    root = tmp_path / "root"
    # many steps: on a loaded machine the poll may see step 0 only when a short run is
    # nearly done, and a run must still be going when the signals come
    child = _start(tmp_path, 400, "--executor", "local")
    run_id = _wait_for_step(root, 0, child)
    child.send_signal(signal.SIGINT)
    time.sleep(0.05)
    child.send_signal(signal.SIGINT)
    out, err = child.communicate(timeout=300)
    assert child.returncode == 130, err
    # a loaded machine may deliver the second signal after the run has reached its step
    # boundary and stopped there: then it is the boundary's cancel that is reported
    assert "stopped at once" in err or "cancelled" in err, err

    status, steps, rows, ids = _stored(root, run_id)
    assert status == "cancelled" and rows == ids
    assert steps == list(range(len(steps))) and len(steps) < 400  # whole steps, a prefix


def test_a_stop_request_is_set_once_by_whoever_asks_first():
    from gfcr.checkpoints.cancel import Stop

    heard: list[str] = []
    stop = Stop(notify=heard.append)
    stop.request("SIGTERM received")
    stop.request("flow run cancelled in Prefect")
    assert stop.requested and stop.reason == "SIGTERM received" and heard == [stop.reason]


def test_ctrl_c_in_a_terminal_cancels_with_the_temporary_server(tmp_path):
    """A terminal's Ctrl-C reaches the whole foreground process group, Prefect's temporary
    server included: the run still stops at a step boundary, records Cancelled in the
    server's flow run and in the store, and prints one line, no traceback."""
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env["PREFECT_HOME"] = str(tmp_path / "prefect-home")  # the temporary server's own database
    path = tmp_path / "tiny.py"
    path.write_text(PIPELINE_FILE.format(steps=40))
    child = subprocess.Popen([sys.executable, "-m", "gfcr.cli", "run", str(path), "--root",
                              str(tmp_path / "root"), "--no-track"], cwd=REPO, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True)  # its own group, as a terminal's job
    root = tmp_path / "root"
    run_id = _wait_for_step(root, 1, child)
    os.killpg(child.pid, signal.SIGINT)  # what the terminal does on Ctrl-C
    out, err = child.communicate(timeout=300)
    assert child.returncode == 130, (out, err)
    assert "Traceback" not in err and "ConnectError" not in err, err
    status, steps, rows, ids = _stored(root, run_id)
    assert status == "cancelled"
    assert steps == list(range(len(steps))) and 2 <= len(steps) < 40
    assert rows == ids
    import sqlite3  # the temporary server is gone: read its database file

    with sqlite3.connect(tmp_path / "prefect-home" / "prefect.db") as db:
        states = db.execute("SELECT state_type FROM flow_run WHERE name = ?", [run_id]).fetchall()
    assert states == [("CANCELLED",)], states


def test_an_error_raised_for_the_second_signal_still_ends_the_run_cancelled(tmp_path):
    """Code interrupted by the second signal may turn its KeyboardInterrupt into an error
    of its own (DuckDB: "Query interrupted"); the run still ends cancelled, not failed,
    and keeps the steps it committed."""
    from gfcr.launch.run import execute
    from gfcr.checkpoints.cancel import Stop

    stop = Stop()

    class SecondSignalDuringAQuery:
        def on_step(self, *, step: int, **_):
            if step == 1:
                stop.request("SIGINT received")
                stop.at_once = True
                raise RuntimeError("Query interrupted")

    try:
        execute(tiny_pipeline(steps=4), root=tmp_path, executor="local", run_id="interrupted",
                hooks=[SecondSignalDuringAQuery()], stop=stop)
    except KeyboardInterrupt as e:
        assert "Query interrupted" in str(e)
    else:
        raise AssertionError("the run went on after a stop at once")
    status, steps, rows, ids = _stored(tmp_path, "interrupted")
    assert status == "cancelled" and steps == [0, 1] and rows == ids == 2 * 16


def test_a_second_signal_while_the_run_records_its_end_interrupts_nothing():
    """Past the step boundary the run records its end (the commit in flight, its status);
    a second signal then marks the stop as at once but raises nothing into that record.
    Before it, the second signal raises KeyboardInterrupt."""
    from gfcr.checkpoints.cancel import Stop, on_signals

    stop = Stop()
    with on_signals(stop):
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.requested and not stop.at_once
        stop.ending = True
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.at_once
    stop = Stop()
    try:
        with on_signals(stop):
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
    except KeyboardInterrupt:
        assert stop.at_once
    else:
        raise AssertionError("a second signal before the run's end did not stop it at once")


def test_a_signal_after_the_cli_run_has_stopped_is_ignored():
    """``gfcr run``'s handlers stay once a stop was requested (on_signals(last=True)): a
    second signal that comes after the run stopped marks the stop and raises nothing into
    the command's last words (Python's own handler would, and click would print Aborted)."""
    from gfcr.checkpoints.cancel import Stop, on_signals

    stop = Stop()
    try:
        with on_signals(stop, last=True):
            os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.1)
        assert stop.requested and stop.at_once and stop.ending
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
