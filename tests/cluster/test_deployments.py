"""gfcr on a real control plane: a Prefect server and an MLflow tracking server on
PostgreSQL, a process work pool with a worker, a rollout store whose catalog is in
PostgreSQL. Deployments, scheduled and submitted runs, the GPU slot, bad input, and the
cancel and crash drills (each ends with every step stored exactly once).

The tests run in file order and share the cluster (one per module); the pipeline is the
tiny one, 2 steps (24 larger ones in the drills, so there is a middle to stop in)."""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from pathlib import Path
from typing import Any

import pytest

from gfcr.launch.flow import device_limit_name
from gfcr.checkpoints import checkpoint
from store import RolloutStore
from tests.conftest import tiny_pipeline

from .conftest import POOL, Cluster, client, descendants

pytestmark = pytest.mark.postgres

STAGES = ("uniform", "group", "verify", "dynamic_sampling", "grpo")
PER_STEP = 16  # 4 prompts x 4 samples
LONG_STEPS, LONG_PER_STEP = 24, 64
LONG = ("--set", f"steps={LONG_STEPS}", "--set", "uniform.batch=16")
"""The drills' runs: long enough that a kill lands in the middle."""
CANCELLED = ("--set", "steps=120", "--set", "uniform.batch=16")
"""The cancel drill's run: a step takes ~0.3 s and a cancel ~7 s to reach the flow here."""


@pytest.fixture(scope="module")
def spec_file(cluster: Cluster) -> Path:
    path = cluster.work / "tiny.yaml"
    path.write_text(tiny_pipeline(steps=2).to_yaml())
    return path


def _flow_runs(api: str, name: str | None = None, deployment: str | None = None) -> list[Any]:
    """Flow runs called ``name``, or of ``deployment``, or all."""
    from prefect.client.schemas.filters import (DeploymentFilter, DeploymentFilterName,
                                                FlowRunFilter, FlowRunFilterName)

    with client(api) as c:
        if name is not None:
            return c.read_flow_runs(flow_run_filter=FlowRunFilter(
                name=FlowRunFilterName(any_=[name])))
        if deployment is not None:
            return c.read_flow_runs(deployment_filter=DeploymentFilter(
                name=DeploymentFilterName(any_=[deployment])))
        return c.read_flow_runs()


def _wait_state(api: str, name: str, state: str, timeout: float = 400) -> Any:
    """The newest flow run called ``name`` once it is in ``state``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        runs = sorted(_flow_runs(api, name), key=lambda r: r.created)
        if runs and runs[-1].state is not None:
            if runs[-1].state.type.value == state:
                return runs[-1]
            assert not runs[-1].state.is_final(), (name, runs[-1].state)
        time.sleep(1)
    raise AssertionError(f"flow run {name} not {state} within {timeout} s")


def _store(cluster: Cluster) -> RolloutStore:
    return RolloutStore.open(cluster.store, read_only=True)


def _steps(cluster: Cluster, run_id: str) -> tuple[str, list[int], int, int]:
    with _store(cluster) as s:
        status = s.sql("SELECT status FROM runs WHERE run_id = ?", [run_id]).to_pylist()
        steps = [r["step"] for r in s.sql("SELECT step FROM steps WHERE run_id = ? ORDER BY step",
                                          [run_id]).to_pylist()]
        n = s.sql("SELECT count(*) AS n, count(DISTINCT rollout_id) AS ids FROM rollouts "
                  "WHERE run_id = ?", [run_id]).to_pylist()[0]
    return (status[0]["status"] if status else "-"), steps, n["n"], n["ids"]


def _wait_step(reader: RolloutStore, run_id: str, step: int, timeout: float = 400) -> None:
    """Once the store holds ``step`` of ``run_id`` (``reader`` is opened beforehand: an
    open takes seconds on a busy machine, while a step takes a fraction of one)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = reader.sql("SELECT max(step) AS m FROM steps WHERE run_id = ?", [run_id]).to_pylist()
        if got and got[0]["m"] is not None and got[0]["m"] >= step:
            return
        time.sleep(0.1)
    raise AssertionError(f"run {run_id} did not commit step {step} within {timeout} s")


def _one_paragraph(result: Any, *needles: str) -> None:
    assert result.returncode == 2, (result.stdout, result.stderr)
    text = " ".join(result.stderr.split())
    assert "Traceback" not in result.stderr, result.stderr
    for needle in needles:
        assert needle in text, text


def test_bad_input_is_one_paragraph_and_creates_nothing(cluster: Cluster, spec_file: Path):
    bad = cluster.work / "bad.yaml"
    bad.write_text(spec_file.read_text().replace("type: group", "type: grop"))
    _one_paragraph(cluster.gfcr("deploy", str(bad), "--pool", POOL, "--name", "tiny"),
                   "unknown stage type 'grop'", "stages[1]")
    _one_paragraph(cluster.gfcr("deploy", str(spec_file), "--pool", "no-such-pool",
                                "--name", "tiny"), "no work pool 'no-such-pool'")
    _one_paragraph(cluster.gfcr("submit", "no-such-deployment"),
                   "no deployment 'gfcr/no-such-deployment'")
    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        nowhere = f"http://127.0.0.1:{closed.getsockname()[1]}/api"
        _one_paragraph(cluster.gfcr("deploy", str(spec_file), "--pool", POOL, "--name",
                                    "tiny", env={"PREFECT_API_URL": nowhere}),
                       f"cannot reach the Prefect API at {nowhere}")
    with client(cluster.api) as c:
        assert c.read_deployments() == []
        assert c.read_flow_runs() == []


def test_scheduled_and_submitted_runs_complete_through_the_worker(cluster: Cluster,
                                                                   spec_file: Path):
    deployed = cluster.gfcr("deploy", str(spec_file), "--pool", POOL, "--name", "tiny",
                            "--interval", "30", "--store", cluster.store, "--tracking",
                            cluster.mlflow, "--root", str(cluster.root),
                            "--env", "CUDA_VISIBLE_DEVICES=0")
    assert deployed.returncode == 0, deployed.stderr
    assert deployed.stdout.strip() == "gfcr/tiny"
    submitted = cluster.gfcr("submit", "tiny")
    assert submitted.returncode == 0, submitted.stderr
    run_id = submitted.stdout.strip()

    scheduled = _first_scheduled_run(cluster)
    _pause_schedule(cluster)
    done = [_wait_state(cluster.api, name, "COMPLETED") for name in (run_id, scheduled)]
    for flow_run in done:
        status, steps, rows, ids = _steps(cluster, flow_run.name)
        assert (status, steps, rows, ids) == ("finished", [0, 1], 2 * PER_STEP, 2 * PER_STEP)
        _one_task_run_per_stage_per_step(cluster, flow_run.id, steps=2)
    _metrics_in_mlflow(cluster, [r.name for r in done])
    _never_shared_the_gpu(cluster, [r.name for r in done])

    listed = cluster.gfcr("runs", "--store", cluster.store, "--format", "json")
    assert listed.returncode == 0, listed.stderr
    states = {r["run_id"]: (r["status"], r["prefect"]) for r in json.loads(listed.stdout)}
    assert states[run_id] == ("finished", "Completed")


@pytest.fixture(scope="module")
def drill(cluster: Cluster, spec_file: Path) -> str:
    """A deployment for the drills: unscheduled, no device (a killed run's device slot
    stays taken until its lease expires)."""
    deployed = cluster.gfcr("deploy", str(spec_file), "--pool", POOL, "--name", "drill",
                            "--store", cluster.store, "--tracking", cluster.mlflow,
                            "--root", str(cluster.root))
    assert deployed.returncode == 0, deployed.stderr
    RolloutStore.open(cluster.store).close()  # the store exists, whichever test runs first
    return "drill"


def test_resume_of_an_unknown_run_is_refused_before_any_flow_run(cluster: Cluster, drill: str):
    before = len(_flow_runs(cluster.api))
    _one_paragraph(cluster.gfcr("submit", drill, "--resume", "tiny-no-such-run"),
                   "no run 'tiny-no-such-run' in store", "nothing was submitted")
    assert len(_flow_runs(cluster.api)) == before


def test_cancel_drill(cluster: Cluster, drill: str):
    from prefect.states import Cancelling

    with _store(cluster) as reader, client(cluster.api) as c:
        submitted = cluster.gfcr("submit", drill, *CANCELLED)
        assert submitted.returncode == 0, submitted.stderr
        run_id = submitted.stdout.strip()
        flow_run_id = submitted.stderr.split("(flow run ")[1].split(")")[0]
        _wait_step(reader, run_id, 0)
        # what the UI's button and `prefect flow-run cancel` do
        c.set_flow_run_state(flow_run_id, Cancelling())
    _wait_state(cluster.api, run_id, "CANCELLED", timeout=120)
    status, steps, rows, ids = _steps(cluster, run_id)
    assert status == "cancelled" and steps == list(range(len(steps))) and len(steps) < 120
    assert rows == ids == len(steps) * LONG_PER_STEP
    saved = checkpoint.latest(checkpoint.directory(cluster.root, run_id))
    assert saved is not None and saved.step == steps[-1]

    assert _submit(cluster, drill, *CANCELLED, "--resume", run_id) == run_id
    _wait_state(cluster.api, run_id, "COMPLETED")
    assert _steps(cluster, run_id) == ("finished", list(range(120)), 120 * LONG_PER_STEP,
                                       120 * LONG_PER_STEP)


def test_crash_drill(cluster: Cluster, drill: str):
    with _store(cluster) as reader:
        run_id = _submit(cluster, drill, *LONG)
        _wait_step(reader, run_id, 0)
    assert cluster.worker is not None
    doomed = [cluster.worker.pid, *descendants(cluster.worker.pid)]
    for pid in doomed:  # the host goes away: worker and flow process, no goodbye
        os.kill(pid, signal.SIGKILL)
    cluster.worker.wait()
    status, steps, _, _ = _steps(cluster, run_id)
    assert status == "running" and len(steps) < LONG_STEPS

    cluster.start_worker()
    assert _submit(cluster, drill, *LONG, "--resume", run_id) == run_id
    _wait_state(cluster.api, run_id, "COMPLETED")
    assert _steps(cluster, run_id) == ("finished", list(range(LONG_STEPS)),
                                       LONG_STEPS * LONG_PER_STEP, LONG_STEPS * LONG_PER_STEP)


# --------------------------------------------------------------------------- helpers


def _submit(cluster: Cluster, deployment: str, *args: str) -> str:
    result = cluster.gfcr("submit", deployment, *args)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def _first_scheduled_run(cluster: Cluster, timeout: float = 120) -> str:
    """The name of the first run the schedule made, once it has started (renamed to its
    run id)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for run in _flow_runs(cluster.api, deployment="tiny"):
            if run.auto_scheduled and run.state is not None and run.state.type.value in (
                    "RUNNING", "COMPLETED") and run.name.startswith("tiny-"):
                return run.name
        time.sleep(1)
    raise AssertionError(f"no scheduled run started within {timeout} s")


def _pause_schedule(cluster: Cluster) -> None:
    """No more scheduled runs: pause the deployment, drop runs not started yet."""
    with client(cluster.api) as c:
        deployment = c.read_deployment_by_name("gfcr/tiny")
        c.pause_deployment(deployment.id)
        for run in _flow_runs(cluster.api, deployment="tiny"):
            if run.auto_scheduled and run.state is not None and run.state.type.value == "SCHEDULED":
                c.delete_flow_run(run.id)


def _one_task_run_per_stage_per_step(cluster: Cluster, flow_run_id: Any, steps: int) -> None:
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with client(cluster.api) as c:
        tasks = c.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
    names = [t.name for t in tasks]
    for step in range(steps):
        for stage in (*STAGES, "commit", "checkpoint") if step == steps - 1 else (*STAGES, "commit"):
            assert names.count(f"{stage}[step={step}]") == 1, (stage, step, sorted(names))


def _metrics_in_mlflow(cluster: Cluster, run_ids: list[str]) -> None:
    from mlflow.tracking import MlflowClient

    mlflow = MlflowClient(tracking_uri=cluster.mlflow)
    experiment = mlflow.get_experiment_by_name("tiny")
    assert experiment is not None
    for run_id in run_ids:
        found = mlflow.search_runs([experiment.experiment_id],
                                   filter_string=f"tags.`gfcr.run_id` = '{run_id}'")
        assert len(found) == 1 and found[0].info.status == "FINISHED"
        history = mlflow.get_metric_history(found[0].info.run_id, "step_seconds")
        assert sorted(m.step for m in history) == [0, 1]


def _never_shared_the_gpu(cluster: Cluster, run_ids: list[str]) -> None:
    """Both runs had CUDA_VISIBLE_DEVICES=0: the device's limit exists with one slot, and
    their stored lifetimes do not overlap."""
    with client(cluster.api) as c:
        limit = c.read_global_concurrency_limit_by_name(device_limit_name("0"))
    assert limit.limit == 1
    with _store(cluster) as s:
        spans = s.sql("SELECT started_at, finished_at FROM runs WHERE list_contains(?, run_id) "
                      "ORDER BY started_at", [run_ids]).to_pylist()
    assert len(spans) == 2 and spans[0]["finished_at"] <= spans[1]["started_at"]
