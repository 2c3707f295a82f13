"""A small real cluster for one test module: PostgreSQL databases, a `prefect server` on
one of them, an MLflow tracking server on another, a process work pool and a worker.

Everything is a real subprocess on this machine. Each test run gets uniquely named
databases (Prefect's, MLflow's and the rollout store's catalog), dropped afterwards. The
tests skip when PostgreSQL at 127.0.0.1:5432 cannot be reached.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.resources import postgres
from tests.resources.postgres import PG

BIN = Path(sys.executable).parent
POOL = "gfcr-test"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, process: subprocess.Popen, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{process.args[:3]} exited with {process.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{url} did not answer within {timeout} s")


def stop(process: subprocess.Popen) -> None:
    """Stop a process started in its own session, and its children."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def descendants(pid: int) -> list[int]:
    """The processes below ``pid`` (from /proc), deepest last."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = [], [pid]
    while frontier:
        children = [p for p, parent in parents.items() if parent in frontier]
        found += children
        frontier = children
    return found


@dataclass
class Cluster:
    api: str
    mlflow: str
    store: str
    """The rollout store: catalog in PostgreSQL, data in a folder (``?data_path=``)."""
    root: Path
    env: dict[str, str]
    work: Path
    worker: subprocess.Popen | None = None
    logs: list[Any] = field(default_factory=list)

    def start_worker(self) -> None:
        log = open(self.work / f"worker-{len(self.logs)}.log", "w")
        self.logs.append(log)
        self.worker = subprocess.Popen(
            [str(BIN / "prefect"), "worker", "start", "--pool", POOL, "--limit", "4",
             "--type", "process"], env=self.env, cwd=self.work, stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True)

    def gfcr(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        return subprocess.run([str(BIN / "gfcr"), *args], env={**self.env, **(env or {})},
                              cwd=self.work, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def databases() -> Iterator[dict[str, str]]:
    tag = uuid.uuid4().hex[:10]
    names = {kind: f"gfcr_{kind}_{tag}" for kind in ("prefect", "mlflow", "store")}
    with postgres.created(list(names.values())):
        yield {kind: f"postgres@{PG['host']}:{PG['port']}/{name}" for kind, name in names.items()}


@pytest.fixture(scope="module")
def cluster(databases: dict[str, str], tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[Cluster]:
    work = tmp_path_factory.mktemp("cluster")
    port, mlflow_port = free_port(), free_port()
    base = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_"))}
    common = {**base, "PREFECT_HOME": str(work / "prefect-home"), "DO_NOT_TRACK": "1",
              "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_LOGGING_LEVEL": "INFO"}
    server_env = {**common, "PREFECT_SERVER_DATABASE_CONNECTION_URL":
                  f"postgresql+asyncpg://{databases['prefect']}",
                  "PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS": "5",
                  "PREFECT_SERVER_UI_ENABLED": "false"}
    with _logged(work / "prefect-server.log") as log:
        server = subprocess.Popen(
            [str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port",
             str(port), "--no-ui"], env=server_env, cwd=work, stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True)
    with _logged(work / "mlflow-server.log") as log:
        mlflow = subprocess.Popen(
            [str(BIN / "mlflow"), "server", "--backend-store-uri",
             f"postgresql+psycopg2://{databases['mlflow']}", "--artifacts-destination",
             str(work / "mlartifacts"), "--host", "127.0.0.1", "--port", str(mlflow_port),
             "--workers", "1"], env=base, cwd=work, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True)
    api = f"http://127.0.0.1:{port}/api"
    cluster = Cluster(api=api, mlflow=f"http://127.0.0.1:{mlflow_port}",
                      store=f"postgresql://{databases['store']}?data_path={work / 'data'}",
                      root=work / "root", work=work,
                      env={**common, "PREFECT_API_URL": api,
                           "PREFECT_WORKER_QUERY_SECONDS": "2",
                           "PREFECT_WORKER_PREFETCH_SECONDS": "5"})
    try:
        wait_http(f"{api}/health", server)
        wait_http(f"{cluster.mlflow}/health", mlflow)
        subprocess.run([str(BIN / "prefect"), "work-pool", "create", POOL, "--type", "process"],
                       env=cluster.env, cwd=work, check=True, capture_output=True, timeout=180)
        cluster.start_worker()
        yield cluster
    finally:
        for process in (cluster.worker, server, mlflow):
            if process is not None:
                stop(process)
        for log in cluster.logs:
            log.close()


@contextmanager
def _logged(path: Path) -> Iterator[Any]:
    with open(path, "w") as log:
        yield log


@contextmanager
def client(api: str) -> Iterator[Any]:
    """A sync Prefect client of the cluster's API, in this process."""
    from prefect import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: api}):
        with get_client(sync_client=True) as c:
            yield c
