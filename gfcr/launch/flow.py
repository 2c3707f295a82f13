"""The gfcr flow: one importable Prefect flow whose parameters are plain data.

``gfcr run`` calls :func:`pipeline_flow` in its own process; a deployment (``gfcr
deploy``) names it by module path (``gfcr.launch.flow.pipeline_flow``), so a Prefect worker on
any host with gfcr installed runs the same code. The parameters say which pipeline (a
ready name, a ``.py``/``.yaml`` path, or the YAML of a spec), what to override, the run
id and where the store, the run root and MLflow live (:class:`RunRequest`); nothing in
them is a live object, so they survive the Prefect API and a deployment's defaults.

While the flow runs it stops cleanly when asked (:mod:`gfcr.runner.cancel`): on the first
SIGINT/SIGTERM (what a worker sends when the flow run is cancelled from the UI, the CLI
or the API) and when a watcher sees the flow run cancelled in the API (runs ``gfcr run``
started in its own process have no worker to signal them). It then ends in Prefect's
state Cancelled, with the store's ``runs.status`` ``cancelled``. With
``CUDA_VISIBLE_DEVICES`` set, the run holds a slot of a global concurrency limit of 1
named after the host and devices for its whole length, so two runs never share a GPU
(:func:`device_slot`).
"""

from __future__ import annotations

import contextvars
import os
import socket
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from prefect import flow, get_run_logger
from prefect.context import FlowRunContext
from prefect.states import Cancelled
from pydantic import BaseModel, ConfigDict, model_validator

from gfcr.core.loading import load
from gfcr.core.pipeline import Pipeline, PipelineError
from gfcr.runner.cancel import RunCancelled, Stop, on_signals
from gfcr.transport.executors import FLOW_NAME, Executor, PrefectExecutor

CANCEL_POLL_SECONDS = 5.0
"""How often a running flow asks the Prefect API whether it was cancelled."""

extra_hooks: contextvars.ContextVar[tuple[Any, ...]] = contextvars.ContextVar(
    "gfcr_extra_hooks", default=())
"""Hooks of the calling process (``gfcr run``'s progress display): set around a call of
the flow in-process; a flow run on a worker has none."""


class RunRequest(BaseModel):
    """What a run needs, as plain data: the flow's parameters."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    pipeline: str | None = None
    """A ready name, a .py/.yaml path, or a spec's YAML (None with ``resume``: the
    run's own stored pipeline)."""
    overrides: tuple[str, ...] = ()
    """``stage.field=value`` assignments (``--set``)."""
    steps: int | None = None
    run_id: str | None = None
    """The run's id (None: a new one from the pipeline name and the time)."""
    resume: bool = False
    """Continue ``run_id``, which the store must hold."""
    root: str = ".gfcr"
    """Run root: checkpoints, staging, caches (and the default store and MLflow)."""
    store: str | None = None
    """Store folder, or ``postgresql://...?data_path=...`` (None: ROOT/store)."""
    tracking: str | None = None
    """MLflow tracking URI (None: SQLite under the root)."""
    track: bool = True
    trackers: tuple[str, ...] = ("mlflow",)
    """Where the run is tracked (gfcr.runner.trackers.TRACKERS), with ``track``."""
    export: str | None = None
    """Export the policy to this folder when the run finishes (gfcr.runner.export)."""
    generate_timeout: float = 600.0
    """With ``fleet``: each request's deadline; with ``score_pool``: seconds a step's
    score call may wait for a worker and run."""
    score_pool: str | None = None
    """Run the scoring filter stages on this pool's workers (``gfcr engine-worker``;
    None: in-process)."""
    fleet: tuple[str, ...] = ()
    """Generate on these vLLM servers (``gfcr engine serve``; gfcr.transport.fleet.Fleet)."""

    @model_validator(mode="before")
    @classmethod
    def _no_generate_pool(cls, data: Any) -> Any:
        """A request naming ``generate_pool`` (removed in issue 24) is refused with what
        replaces it, not as an unknown field."""
        if isinstance(data, dict) and data.get("generate_pool") is not None:
            from gfcr.launch.placement import GeneratePoolRemoved

            raise GeneratePoolRemoved(data["generate_pool"])
        return data


def resolve(request: RunRequest, store: Any) -> Pipeline:
    """The pipeline ``request`` names, with its overrides. Raises PipelineError (or
    ResumeError when a run to resume is missing)."""
    from gfcr.runner.resume import stored_pipeline

    if request.pipeline is None and request.resume and request.run_id:
        spec = stored_pipeline(store, request.run_id)
    else:
        spec = pipeline_from(request.pipeline or "default")
    if request.overrides:
        spec = spec.with_overrides(list(request.overrides))
    if request.steps is not None:
        spec = spec.with_overrides([f"steps={request.steps}"])
    return spec


def pipeline_from(ref: str) -> Pipeline:
    """A pipeline from a ready name, a file path, or a spec's YAML (text with a newline)."""
    if "\n" in ref:
        return Pipeline.from_yaml(ref, where="the pipeline YAML")
    return load(ref)


def open_store(request: RunRequest, *, read_only: bool = False) -> Any:
    """The request's rollout store (``postgresql://`` stores name their data path in the
    URI's ``data_path`` query parameter)."""
    from gfcr.core.storage import backend

    uri = request.store or Path(request.root) / "store"
    return backend().open(uri, read_only=read_only, create=not read_only)


def run_request(request: RunRequest, executor: Executor, *, stop: Stop,
                hooks: tuple[Any, ...] = (),
                named: Callable[[str], None] | None = None) -> Any:
    """Resolve and run ``request``; the run's RunSummary. ``named(run_id)`` is told the
    run's id before it starts."""
    from gfcr.launch.run import execute, new_run_id
    from gfcr.runner.resume import ResumeError, stored_run
    from gfcr.runner.export import ExportHook
    from gfcr.runner.trackers import trackers

    tracked = trackers(request.trackers, mlflow_uri=request.tracking) if request.track else []
    if request.export is not None:
        tracked.append(ExportHook(Path(request.export)))
    store = open_store(request)
    try:
        spec = resolve(request, store)
        if request.resume and (request.run_id is None or stored_run(store, request.run_id) is None):
            raise ResumeError(f"no run {request.run_id!r} in store {store.uri!r} to resume "
                              "(`gfcr runs` lists the runs)")
        run_id = request.run_id or new_run_id(spec)
        if named is not None:
            named(run_id)
        return execute(spec, root=Path(request.root), executor=executor, run_id=run_id,
                       hooks=[*hooks, *tracked], store=store, stop=stop,
                       fleet=_generation(request), score_pool=_placement(request))
    finally:
        store.close()


def _generation(request: RunRequest) -> Any:
    """Where the request generates: a fleet of servers, or None (in-process)."""
    if not request.fleet:
        return None
    from gfcr.transport.fleet import Fleet

    return Fleet(urls=request.fleet, timeout_s=request.generate_timeout)


def _placement(request: RunRequest) -> Any:
    """The request's score pool (gfcr.transport.remote.pool.WorkerPool), or None."""
    if request.score_pool is None:
        return None
    from gfcr.transport.remote.pool import WorkerPool

    return WorkerPool(pool=request.score_pool, timeout_s=request.generate_timeout)


@flow(name=FLOW_NAME, persist_result=False, log_prints=False)
def pipeline_flow(pipeline: str | None = None, overrides: list[str] | None = None,
                  steps: int | None = None, run_id: str | None = None, resume: bool = False,
                  root: str = ".gfcr", store: str | None = None, tracking: str | None = None,
                  track: bool = True, generate_timeout: float = 600.0,
                  score_pool: str | None = None, fleet: list[str] | None = None,
                  trackers: list[str] | None = None, export: str | None = None) -> Any:
    """Run a gfcr pipeline (see RunRequest for the parameters); its summary, or the state
    Cancelled when the run was stopped at a step boundary."""
    request = RunRequest(pipeline=pipeline, overrides=tuple(overrides or ()), steps=steps,
                         run_id=run_id, resume=resume, root=root, store=store,
                         tracking=tracking, track=track, generate_timeout=generate_timeout,
                         score_pool=score_pool, fleet=tuple(fleet or ()),
                         trackers=tuple(trackers or ("mlflow",)), export=export)
    logger = get_run_logger()
    stop = Stop(notify=lambda why: logger.warning(
        "stopping after the step under way (%s); a second signal stops at once", why))
    try:
        with on_signals(stop), watch_cancel(stop), device_slot():
            return run_request(request, PrefectExecutor(), stop=stop,
                               hooks=extra_hooks.get(), named=_rename)
    except RunCancelled as e:
        return Cancelled(message=str(e))


def _rename(run_id: str) -> None:
    """Name the flow run after the gfcr run (a scheduled run gets a generated name)."""
    from prefect import get_client

    ctx = FlowRunContext.get()
    if ctx is None or ctx.flow_run is None or ctx.flow_run.name == run_id:
        return
    with get_client(sync_client=True) as client:
        client.update_flow_run(ctx.flow_run.id, name=run_id)


@contextmanager
def watch_cancel(stop: Stop, every: float = CANCEL_POLL_SECONDS) -> Iterator[None]:
    """While inside a flow run: a thread asks the API every ``every`` seconds whether the
    flow run is being cancelled, and requests ``stop`` if so."""
    ctx = FlowRunContext.get()
    if ctx is None or ctx.flow_run is None:
        yield
        return
    flow_run_id, done = ctx.flow_run.id, threading.Event()

    def poll() -> None:
        from prefect import get_client

        with get_client(sync_client=True) as client:
            while not done.wait(every):
                try:
                    state = client.read_flow_run(flow_run_id).state
                except Exception:  # an API hiccup: ask again next time
                    continue
                if state is not None and (state.is_cancelling() or state.is_cancelled()):
                    stop.request("flow run cancelled in Prefect")
                    return
    # the thread sees this context's Prefect settings (the API URL of a test server)
    watcher = threading.Thread(target=contextvars.copy_context().run, args=(poll,),
                               name="gfcr-cancel-watch", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()


def device_limit_name(devices: str, host: str | None = None) -> str:
    """The global concurrency limit that guards ``devices`` (CUDA_VISIBLE_DEVICES) on a host."""
    safe = "".join(c if c.isalnum() else "_" for c in devices)
    return f"gfcr-gpu-{host or socket.gethostname()}-{safe}"


@contextmanager
def device_slot() -> Iterator[None]:
    """With CUDA_VISIBLE_DEVICES set (a deployment's job variable, or the shell's), hold
    the one slot of the global concurrency limit for those devices on this host, created
    with limit 1 if missing: a second run for the same GPU waits until the first ends.
    Prefect leases the slot and renews it while the run goes on; a killed process's slot
    is freed when its lease expires."""
    devices = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    if not devices or FlowRunContext.get() is None:
        yield
        return
    from prefect import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
    from prefect.concurrency.sync import concurrency
    from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound

    name = device_limit_name(devices)
    with get_client(sync_client=True) as client:
        try:
            client.read_global_concurrency_limit_by_name(name)
        except ObjectNotFound:
            try:
                client.create_global_concurrency_limit(
                    GlobalConcurrencyLimitCreate(name=name, limit=1))
            except ObjectAlreadyExists:
                pass
    get_run_logger().info("waiting for device slot %s", name)
    with concurrency(name, occupy=1, strict=True):
        yield


__all__ = ["PipelineError", "RunRequest", "pipeline_flow", "run_request"]
