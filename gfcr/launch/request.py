"""What ``gfcr run`` asks for, as plain data (:class:`RunRequest`, its one declaration),
resolved once (:func:`resolve`) and run in this process (:func:`run_request`): the part
of the gfcr flow (:mod:`gfcr.launch.flow`) that needs no Prefect.

Resolving a request loads its pipeline (a ready name, a file, a spec's YAML or, on a
resume, the run's stored one), applies its overrides and settles its placement with the
pipeline's (gfcr.launch.placement): a :class:`Launch`. A caller that resolved a request
hands the flow :func:`settled`, the same launch as plain data (the checked spec's YAML,
no overrides, the settled placement), so nothing is looked up or overridden twice.

``gfcr run --executor local`` runs a launch without importing Prefect at all (a GPU
machine or a container may not have it); the Prefect flow calls :func:`run_request`
inside a flow run.
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from pydantic import BaseModel, ConfigDict, field_serializer, model_validator

from gfcr.core.loading import load
from gfcr.core.pipeline import Pipeline
from gfcr.launch.hooks import RunSummary
from gfcr.launch.ledger import RunLedger, open_ledger
from gfcr.launch.placement import (Placement, Source, explicit, refuse_generate_pool,
                                   settle)
from gfcr.checkpoints.cancel import Stop
from gfcr.transport.executors import Executor

extra_hooks: contextvars.ContextVar[tuple[object, ...]] = contextvars.ContextVar(
    "gfcr_extra_hooks", default=())
"""Hooks of the calling process (``gfcr run``'s progress display): set around a call of
the flow in-process; a flow run on a worker has none."""


class RunRequest(BaseModel):
    """What a run needs, as plain data: the flow's one parameter."""

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
    placement: Placement = Placement()
    """Where the generator, learner and scorer run (gfcr.launch.placement): one source,
    settled with the pipeline's own ``learner``."""

    @field_serializer("placement")
    def _given(self, placement: Placement) -> dict[str, object]:
        """Only what its sources set: a request that crosses Prefect as plain data keeps
        a default as a default, not as a setting that could conflict with another."""
        return placement.model_dump(mode="json", exclude_unset=True)

    @model_validator(mode="before")
    @classmethod
    def _no_generate_pool(cls, data: object) -> object:
        """A request naming ``generate_pool`` (removed in issue 24) is refused with what
        replaces it, not as an unknown field."""
        if isinstance(data, dict):
            refuse_generate_pool(data.get("generate_pool"))
        return data


@dataclass(frozen=True)
class Launch:
    """A request resolved: the pipeline to run (overrides applied, placement settled),
    where its services run, and the run id."""

    request: RunRequest
    pipeline: Pipeline
    placement: Placement
    run_id: str


def resolve(request: RunRequest, store: RunLedger | None,
            sources: Sequence[Source] = ()) -> Launch:
    """The launch ``request`` asks for: its pipeline with its overrides, its placement
    settled with the pipeline's and ``sources`` (named in a conflict), and its run id.
    ``store`` is read for a resume without a pipeline. Raises PipelineError,
    PlacementConflict/PlacementError, or ResumeError when a run to resume is missing."""
    from gfcr.launch.run import new_run_id
    from gfcr.checkpoints.resume import stored_pipeline

    if request.pipeline is None and request.resume and request.run_id and store is not None:
        spec = stored_pipeline(store, request.run_id)
    else:
        spec = pipeline_from(request.pipeline or "default")
    if request.overrides:
        spec = spec.with_overrides(list(request.overrides))
    if request.steps is not None:
        spec = spec.with_overrides([f"steps={request.steps}"])
    given = explicit(request.placement)
    spec, placement = settle(spec, [*sources, *([("the run request's placement", given)]
                                                if given else [])])
    return Launch(request, spec, placement, request.run_id or new_run_id(spec))


def settled(launch: Launch) -> RunRequest:
    """``launch`` as plain data that resolves to the same launch without looking
    anything up again: the checked spec's YAML, no overrides, the settled placement."""
    return launch.request.model_copy(update={
        "pipeline": launch.pipeline.to_yaml(), "overrides": (), "steps": None,
        "run_id": launch.run_id, "placement": launch.placement})


def pipeline_from(ref: str) -> Pipeline:
    """A pipeline from a ready name, a file path, or a spec's YAML (text with a newline)."""
    if "\n" in ref:
        return Pipeline.from_yaml(ref, where="the pipeline YAML")
    return load(ref)


def open_store(request: RunRequest, *, read_only: bool = False) -> RunLedger:
    """The request's rollout store (``postgresql://`` stores name their data path in the
    URI's ``data_path`` query parameter)."""
    return open_ledger(request.store or Path(request.root) / "store", read_only=read_only)


def run_request(request: RunRequest, executor: Executor, *, stop: Stop,
                hooks: Sequence[object] = (),
                named: Callable[[str], None] | None = None,
                launch: Launch | None = None) -> RunSummary:
    """Resolve and run ``request`` (or run ``launch``, already resolved from it); the
    run's RunSummary. ``named(run_id)`` is told the run's id before it starts."""
    from gfcr.launch.run import run_settled
    from gfcr.checkpoints.resume import ResumeError, stored_run
    from gfcr.checkpoints.export import ExportHook
    from gfcr.tracking.trackers import trackers

    tracked: list[object] = list(trackers(request.trackers, mlflow_uri=request.tracking)
                                 if request.track else [])
    if request.export is not None:
        tracked.append(ExportHook(Path(request.export)))
    store = open_store(request)
    try:
        launch = launch or resolve(request, store)
        if request.resume and (request.run_id is None or stored_run(store, request.run_id) is None):
            raise ResumeError(f"no run {request.run_id!r} in store {store.uri!r} to resume "
                              "(`gfcr runs` lists the runs)")
        if named is not None:
            named(launch.run_id)
        return run_settled(launch.pipeline, launch.placement, root=Path(request.root),
                           executor=executor, run_id=launch.run_id,
                           hooks=[*hooks, *tracked], store=store, stop=stop)
    finally:
        store.close()
