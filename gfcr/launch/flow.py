"""The gfcr flow: one importable Prefect flow whose parameters are plain data.

``gfcr run`` calls :func:`pipeline_flow` in its own process; a deployment (``gfcr
deploy``) names it by module path (``gfcr.launch.flow.pipeline_flow``), so a Prefect worker on
any host with gfcr installed runs the same code. The parameters say which pipeline (a
ready name, a ``.py``/``.yaml`` path, or the YAML of a spec), what to override, the run
id, where the store, the run root and MLflow live and where the services run
(:class:`RunRequest`, the flow's one parameter); nothing in it is a live object, so they survive the Prefect API and a deployment's defaults.

While the flow runs it stops cleanly when asked (:mod:`gfcr.checkpoints.cancel`): on the first
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
from typing import Iterator

from prefect import flow, get_run_logger
from prefect.context import FlowRunContext
from prefect.client.schemas.objects import State
from prefect.states import Cancelled

from gfcr.core.pipeline import PipelineError
from gfcr.launch.hooks import RunSummary
from gfcr.launch.request import (RunRequest, extra_hooks, open_store, pipeline_from, resolve,
                                 run_request, settled)
from gfcr.checkpoints.cancel import RunCancelled, Stop, on_signals
from gfcr.transport.executors import FLOW_NAME, PrefectExecutor

CANCEL_POLL_SECONDS = 5.0
"""How often a running flow asks the Prefect API whether it was cancelled."""

@flow(name=FLOW_NAME, persist_result=False, log_prints=False)
def pipeline_flow(request: RunRequest = RunRequest()) -> RunSummary | State:
    """Run a gfcr pipeline (``request``: see RunRequest); its summary, or the state
    Cancelled when the run was stopped at a step boundary."""
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


__all__ = ["PipelineError", "RunRequest", "extra_hooks", "open_store", "pipeline_flow",
           "pipeline_from", "resolve", "run_request", "settled"]
