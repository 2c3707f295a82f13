"""What ``gfcr run`` asks for, as plain data, and running it in this process: the part of
the gfcr flow (:mod:`gfcr.launch.flow`) that needs no Prefect.

``gfcr run --executor local`` runs a :class:`RunRequest` through :func:`run_request`
without importing Prefect at all (a GPU machine or a container may not have it); the
Prefect flow calls the same function inside a flow run.
"""

from __future__ import annotations

import contextvars
from pathlib import Path
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict, model_validator

from gfcr.core.loading import load
from gfcr.core.pipeline import Pipeline
from gfcr.checkpoints.cancel import Stop
from gfcr.transport.executors import Executor

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
    """Where the run is tracked (gfcr.tracking.trackers.TRACKERS), with ``track``."""
    export: str | None = None
    """Export the policy to this folder when the run finishes (gfcr.checkpoints.export)."""
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
    from gfcr.checkpoints.resume import stored_pipeline

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
    from gfcr.checkpoints.resume import ResumeError, stored_run
    from gfcr.checkpoints.export import ExportHook
    from gfcr.tracking.trackers import trackers

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
