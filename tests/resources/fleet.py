"""Real vLLM CPU servers for the fleet tests, each started with ``gfcr engine serve`` as
a subprocess of its own session (so a test can kill -9 a server's whole process group:
API server, engine core and worker, as a machine that dies would).

The suite starts two once (:func:`pool`, the session fixture ``fleet_servers`` of
tests/conftest.py) and every fleet test module shares them (:func:`revive` restarts one
a test left dead); a run loads its own weights onto them first, so what a test before
left loaded does not matter. They hold a fleet key (issue 30), whose file the pool names
in ``GFCR_FLEET_KEY_FILE`` for the test process while they run (so ``Fleet`` sends it),
and load versions published under the session's temporary root (every test's
``tmp_path``)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import httpx

REPO = Path(__file__).resolve().parents[2]
KV_BYTES = 50_000_000
"""Each server's KV cache (the tiny policy needs little; the machine is shared)."""


@dataclass
class Started:
    """One server: its URL, process and log, and its key file and weights root."""

    url: str
    port: int
    proc: subprocess.Popen
    log: Path
    model: Path
    key_file: Path
    weights_root: Path

    def key(self) -> bytes:
        return self.key_file.read_text().strip().encode()

    def kill(self) -> None:
        """kill -9 the server's process group (it was started in a session of its own)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(model: Path, log: Path, key_file: Path, weights_root: Path,
          port: int | None = None) -> Started:
    """``gfcr engine serve`` on ``model`` with the fleet key in ``key_file``, loading
    from ``weights_root``; returns at once (see :func:`wait_healthy`)."""
    port = port or free_port()
    argv = [sys.executable, "-c", "from gfcr.cli import main; main()", "engine", "serve",
            "--model", str(model), "--port", str(port), "--max-model-len", "256",
            "--key-file", str(key_file), "--weights-root", str(weights_root),
            "--kv-cache-memory-bytes", str(KV_BYTES), "--enforce-eager"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    return Started(f"http://127.0.0.1:{port}", port, proc, log, model, key_file, weights_root)


def wait_healthy(servers: list[Started], timeout_s: float = 600.0) -> None:
    """Wait until every server answers ``/health``; fail with its log's tail if one exits
    or does not answer in time."""
    deadline = time.monotonic() + timeout_s
    waiting = list(servers)
    while waiting:
        for server in list(waiting):
            if server.proc.poll() is not None:
                raise RuntimeError(f"vLLM server {server.url} exited: "
                                   f"{server.log.read_text()[-2000:]}")
            try:
                if httpx.get(server.url + "/health", timeout=2.0).status_code == 200:
                    waiting.remove(server)
            except httpx.HTTPError:
                pass
        if waiting and time.monotonic() > deadline:
            raise TimeoutError(f"vLLM servers {[s.url for s in waiting]} not healthy after "
                               f"{timeout_s:.0f} s")
        time.sleep(1.0)


def pool(where: Path, weights_root: Path) -> Iterator[list[Started]]:
    """Two servers of the tiny vLLM policy, healthy, with a fleet key (named in
    ``GFCR_FLEET_KEY_FILE`` meanwhile), loading from ``weights_root``; killed when the
    generator closes."""
    from gfcr.transport.fleet_gate import KEY_ENV
    from gfcr.transport.remote.keys import new_key
    from stages.engines._vllm_run import save_policy
    from tests.resources.vllm import VLLM_POLICY

    save_policy(VLLM_POLICY.build(seed=0), where / "model")
    key = new_key(where / "fleet.key")
    started = [start(where / "model", where / f"server-{i}.log", key, weights_root)
               for i in range(2)]
    before = os.environ.get(KEY_ENV)
    os.environ[KEY_ENV] = str(key)
    try:
        wait_healthy(started)
        yield started
    finally:
        for server in started:
            server.kill()
        if before is None:
            os.environ.pop(KEY_ENV, None)
        else:
            os.environ[KEY_ENV] = before


def revive(started: list[Started]) -> list[Started]:
    """``started`` (the same list), with any server that exited started again on its
    port and model, and every server healthy."""
    for i, server in enumerate(started):
        if server.proc.poll() is not None:
            started[i] = start(server.model, server.log.with_suffix(".revived.log"),
                               server.key_file, server.weights_root, port=server.port)
    wait_healthy(started)
    return started
