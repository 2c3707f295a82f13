"""A run whose process died shows crashed in Prefect too (issue 18 item 6): ``gfcr runs``
sets a SIGKILLed run's flow run to Crashed once its lease is stale, and a resume that
takes a dead process's lease over does the same, leaving flow runs started after the
death alone."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace

from tests.gfcr.test_cancel import REPO, _flow_run_states, _start, _wait_for_step


def test_sigkill_then_gfcr_runs_shows_crashed_in_the_store_and_in_prefect(tmp_path, prefect_server):
    from prefect.settings import PREFECT_API_URL

    env = {"PREFECT_API_URL": str(PREFECT_API_URL.value()), "GFCR_LEASE_SECONDS": "2"}
    child = _start(tmp_path, 50, env=env)
    try:
        run_id = _wait_for_step(tmp_path / "root", 0, child)
        assert _flow_run_states(run_id) == ["RUNNING"]
        child.send_signal(signal.SIGKILL)
        child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
    time.sleep(2.5)  # the lease (2 s here, GFCR_LEASE_SECONDS) lapses
    listed = subprocess.run([sys.executable, "-m", "gfcr.cli", "runs", "--root",
                             str(tmp_path / "root"), "--format", "json"], cwd=REPO,
                            env={**os.environ, **env}, capture_output=True, text=True, timeout=300)
    assert listed.returncode == 0, listed.stderr
    # the shared test server also holds other tests' flow runs, which `gfcr runs` lists too
    [row] = [r for r in json.loads(listed.stdout) if r["run_id"] == run_id]
    assert (row["run_id"], row["status"], row["prefect"]) == (run_id, "crashed", "Crashed")
    assert "died" in row["error"]
    assert _flow_run_states(run_id) == ["CRASHED"]


def _flow_run(client, name: str):
    """A flow run of the ``gfcr`` flow named ``name``, in state Running."""
    from prefect import flow
    from prefect.states import Running

    @flow(name="gfcr")
    def gfcr() -> None:
        """Stands for gfcr's flow: only its name is used."""

    return client.create_flow_run(gfcr, name=name, state=Running())


def test_taking_over_a_dead_runs_lease_crashes_only_its_flow_runs(tmp_path, prefect_server):
    from prefect import get_client

    from gfcr.transport.prefect_crash import after_takeover
    from store import RolloutStore
    from store.lease import RunLease, hold

    run_id = "takeover-1"
    with get_client(sync_client=True) as client, RolloutStore.open(tmp_path / "s") as store:
        dead_flow_run = _flow_run(client, run_id)
        time.sleep(0.05)
        store.start_run(run_id, pipeline="p", spec_yaml="x", spec_hash="h", code_version="v")
        dead = RunLease(store.catalog, run_id)
        dead.holder = replace(dead.holder, pid=2**22 + 7)  # no such process here
        dead.acquire()
        dead.stop_renewing()
        time.sleep(0.05)
        later = _flow_run(client, run_id)  # started after the dead process took its lease
        with hold(store, run_id) as lease:
            after_takeover(run_id, lease)
        states = {r.id: r.state for r in (client.read_flow_run(dead_flow_run.id),
                                          client.read_flow_run(later.id))}
    assert states[dead_flow_run.id].type.value == "CRASHED"
    assert "no longer exists" in (states[dead_flow_run.id].message or "")
    assert states[later.id].type.value == "RUNNING"
