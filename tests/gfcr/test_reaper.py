"""The temporary Prefect server dies with its run (issue 26 item 8): after a kill -9 of
`gfcr run` it lived on, orphaned."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from store import RolloutStore, StoreError

REPO = Path(__file__).resolve().parents[2]
PIPELINE_FILE = """
from tests.conftest import tiny_pipeline
pipeline = tiny_pipeline(steps=500)
"""


def _servers(parent: int) -> list[int]:
    """Prefect temporary servers (uvicorn on Prefect's app) that ``parent`` started."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            command = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if int(stat[1]) == parent and b"uvicorn" in command and b"prefect.server" in command:
            found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def _committed(root: Path) -> bool:
    try:
        with RolloutStore.open(root / "store", read_only=True) as s:
            return s.sql("SELECT count(*) AS n FROM steps").column("n")[0].as_py() > 0
    except StoreError:
        return False


def test_the_temporary_server_dies_with_a_killed_run(tmp_path):
    (tmp_path / "p.py").write_text(PIPELINE_FILE)
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    run = subprocess.Popen([sys.executable, "-m", "gfcr.cli", "run", str(tmp_path / "p.py"),
                            "--root", str(tmp_path / "root"), "--no-track"], cwd=REPO, env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    servers: list[int] = []
    try:
        deadline = time.monotonic() + 300
        while not (servers and _committed(tmp_path / "root")):
            assert run.poll() is None and time.monotonic() < deadline, "no step committed"
            servers = servers or _servers(run.pid)
            time.sleep(0.5)
        run.send_signal(signal.SIGKILL)
        run.wait(60)
        deadline = time.monotonic() + 120
        while any(_alive(pid) for pid in servers) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not any(_alive(pid) for pid in servers), "the server outlived its run"
    finally:
        if run.poll() is None:
            run.kill()
        for pid in servers:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
