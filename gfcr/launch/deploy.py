"""Deployments of the gfcr flow on Prefect work pools, and runs submitted to them.

``gfcr deploy`` validates the pipeline first (every problem named by stage and field),
then checks the Prefect API and the work pool, and only then creates or updates a
deployment of :func:`gfcr.launch.flow.pipeline_flow`, named by module path so a worker on any
host with gfcr installed imports it (no code upload). The deployment's parameters hold
the validated spec as YAML (what the worker runs is what was checked), the run root, the
store and the MLflow URI, as the flow's one ``request`` (a
deployment made before it took one is made again with ``gfcr deploy``); paths are made absolute, since a process worker runs each flow
in a temporary folder. Job variables pass through to the work pool's job template (a
process pool's ``env`` sets ``CUDA_VISIBLE_DEVICES``, which also selects the device
concurrency limit, :func:`gfcr.launch.flow.device_slot`).

``gfcr submit`` starts a run of a deployment now. It validates the overrides against the
deployment's pipeline and, with ``--resume``, checks the store holds that run and that
the pipeline may continue it, before creating the flow run, which is named by the run id
it prints. Every refusal is a :class:`DeployError` (or PipelineError/ResumeError) whose
message is one paragraph, raised before anything is created in Prefect.
"""

from __future__ import annotations

import inspect

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from gfcr.launch.flow import pipeline_flow
from gfcr.launch.request import Launch, RunRequest, open_store, resolve, settled
from gfcr.transport.executors import FLOW_NAME


class DeployError(RuntimeError):
    """Prefect cannot take the deployment or run as asked; the message says why."""


@dataclass(frozen=True)
class Deployed:
    name: str
    """``gfcr/<deployment>``, as ``gfcr submit`` and ``prefect deployment run`` take it."""
    id: str
    pipeline: str
    spec_hash: str


@dataclass(frozen=True)
class Submitted:
    run_id: str
    flow_run_id: str
    deployment: str


def deploy(ref: str, *, pool: str, name: str | None = None, cron: str | None = None,
           interval: float | None = None, overrides: Sequence[str] = (),
           steps: int | None = None, root: Path = Path(".gfcr"), store: str | None = None,
           tracking: str | None = None, job_variables: dict[str, Any] | None = None
           ) -> Deployed:
    """Create or update the deployment of pipeline ``ref`` on work pool ``pool``."""
    from prefect.deployments.runner import EntrypointType

    if cron is not None and interval is not None:
        raise DeployError("give --cron or --interval, not both")
    launch = resolve(RunRequest(pipeline=ref, overrides=tuple(overrides), steps=steps), None)
    spec = launch.pipeline
    url = _check_api()
    _check_pool(pool, url)
    request = RunRequest(pipeline=spec.to_yaml(), root=str(Path(root).resolve()),
                         store=_absolute_store(store), tracking=tracking)
    parameters = {"request": request.model_dump(mode="json")}
    deployment = pipeline_flow.to_deployment(
        name=name or spec.name, interval=interval, cron=cron, parameters=parameters,
        work_pool_name=pool, job_variables=job_variables or {},
        entrypoint_type=EntrypointType.MODULE_PATH, tags=["gfcr", f"pipeline:{spec.name}"],
        description=f"gfcr pipeline {spec.name!r} (spec hash {spec.spec_hash()}), from {ref}")
    # to_deployment is sync outside an event loop (prefect's sync_compatible)
    assert not inspect.isawaitable(deployment)
    deployment_id = deployment.apply()
    return Deployed(f"{FLOW_NAME}/{deployment.name}", str(deployment_id), spec.name,
                    spec.spec_hash())


def submit(deployment: str, *, overrides: Sequence[str] = (), resume: str | None = None
           ) -> Submitted:
    """Start a run of ``deployment`` now (with ``resume``: continue that run)."""
    from prefect import get_client
    from prefect.exceptions import ObjectNotFound

    full = deployment if "/" in deployment else f"{FLOW_NAME}/{deployment}"
    url = _check_api()
    with get_client(sync_client=True) as client:
        try:
            found = client.read_deployment_by_name(full)
        except ObjectNotFound:
            raise DeployError(
                f"no deployment {full!r} at the Prefect API {url}: create it with "
                "`gfcr deploy PIPELINE --pool POOL --name NAME` (`prefect deployment ls` "
                "lists them); nothing was submitted") from None
        defaults = dict((found.parameters or {}).get("request") or {})
        request = RunRequest(**{**defaults, "run_id": resume, "resume": resume is not None,
                                 "overrides": (*defaults.get("overrides", ()), *overrides)})
        launch = _checked(request)
        flow_run = client.create_flow_run_from_deployment(
            found.id, name=launch.run_id,
            parameters={"request": settled(launch).model_dump(mode="json")})
    return Submitted(launch.run_id, str(flow_run.id), full)


def _checked(request: RunRequest) -> Launch:
    """The request's pipeline, validated; with ``resume``, also checked against the run
    the store holds (which must exist). Reads only."""
    from gfcr.checkpoints import resume

    if not request.resume:
        return resolve(request, None)
    from gfcr.core.storage import backend

    try:
        store = open_store(request, read_only=True)
    except backend().errors as e:
        raise DeployError(f"cannot check run {request.run_id!r} to resume: {e}") from None
    try:
        if request.run_id is None or resume.stored_run(store, request.run_id) is None:
            raise resume.ResumeError(
                f"no run {request.run_id!r} in store {store.uri!r} to resume (`gfcr runs "
                f"--store {store.uri}` lists the runs); nothing was submitted")
        launch = resolve(request, store)
        resume.check(store, request.run_id, launch.pipeline)
        return launch
    finally:
        store.close()


def _check_api() -> str:
    """The Prefect API URL, once it answers; DeployError naming it otherwise."""
    from prefect import get_client
    from prefect.settings import PREFECT_API_URL

    url = PREFECT_API_URL.value()
    if not url:
        raise DeployError(
            "no Prefect server is configured (PREFECT_API_URL is unset): deployments and "
            "submitted runs live on a server that workers poll, not on the temporary one "
            "`gfcr run` starts. Start one (`prefect server start`) and set "
            "PREFECT_API_URL=http://HOST:4200/api (README 'Running on a cluster')")
    with get_client(sync_client=True) as client:
        problem = client.api_healthcheck()
    if problem is not None:
        raise DeployError(
            f"cannot reach the Prefect API at {url} ({type(problem).__name__}: {problem}); "
            "is the server running and PREFECT_API_URL right? Nothing was created")
    return url


def _check_pool(pool: str, url: str) -> None:
    from prefect import get_client
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            client.read_work_pool(pool)
        except ObjectNotFound:
            raise DeployError(
                f"no work pool {pool!r} at the Prefect API {url}: create it with `prefect "
                f"work-pool create {pool} --type process` and start a worker with `prefect "
                f"worker start --pool {pool}`; nothing was created") from None


def _absolute_store(store: str | None) -> str | None:
    """A store folder as an absolute path (a worker runs in a temporary folder)."""
    if store is None or "://" in store:
        return store
    return str(Path(store).expanduser().resolve())
