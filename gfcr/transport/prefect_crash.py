"""Telling Prefect that a run's process died: its flow run set to Crashed.

A process killed with SIGKILL (or whose machine went down) never reports an end to
Prefect, so its flow run would show Running forever. gfcr knows better once the run's
lease (:mod:`store.lease`) is stale: ``gfcr runs`` then shows the run crashed, and a
``--resume`` takes the lease over. At both moments gfcr sets the run's flow runs that
Prefect still shows unfinished to Crashed (forced: nobody will report for them).

Which flow runs: those of the ``gfcr`` flow named by the run id (:mod:`gfcr.launch.flow`) in a
non-final state that started before the dead process took its lease (``before``, epoch
seconds, the lease database's clock). The bound keeps a resume's own new flow run,
started after the death, out of it: a resume that has started but not yet taken the lease
over is not marked. Prefect is asked only when ``PREFECT_API_URL`` is set (the temporary
local server holds no flow run of another process), and a failure to reach it is
returned as a note, never raised: the store's record stands either way.
"""

from __future__ import annotations

import warnings
from datetime import datetime, timezone

UNFINISHED = ("RUNNING", "PENDING", "SCHEDULED", "PAUSED", "CANCELLING")
"""Prefect state types of a flow run that a live process would still move on."""


def crash_flow_runs(run_id: str, reason: str, *, before: float | None = None) -> tuple[int, str | None]:
    """Set the unfinished flow runs of ``run_id`` started before ``before`` (None: any) to
    Crashed with ``reason``; returns (how many were set, a note when Prefect was not asked
    or failed)."""
    from prefect.settings import PREFECT_API_URL

    url = PREFECT_API_URL.value()
    if not url:
        return 0, "Prefect not told: PREFECT_API_URL is unset"
    try:
        return _crash(run_id, reason, before), None
    except Exception as e:  # noqa: BLE001 - unreachable or refusing: the store's record stands
        return 0, (f"Prefect not told that run {run_id!r} crashed: the API at {url} failed "
                   f"({type(e).__name__}: {e})")


def after_takeover(run_id: str, lease: object) -> None:
    """When this process took over the stale lease of one that died (``lease.previous``,
    :func:`store.lease.hold`), set the dead one's flow runs to Crashed. Called before this
    process's own flow run exists; a failure to tell Prefect is a warning."""
    # getattr: StoreBackend.hold yields an opaque lease; only one that took over a stale
    # lease (store.lease.RunLease) has ``previous`` and ``stale_reason``
    previous = getattr(lease, "previous", None)
    if previous is None:
        return
    why = getattr(lease, "stale_reason", None) or "its lease lapsed"
    _, note = crash_flow_runs(run_id, f"the process running it ({previous.holder.describe()}) "
                              f"died: {why}", before=previous.taken_at)
    if note and "PREFECT_API_URL is unset" not in note:
        warnings.warn(note, RuntimeWarning, stacklevel=2)


def _crash(run_id: str, reason: str, before: float | None) -> int:
    from prefect import get_client
    from prefect.client.schemas.filters import (FlowFilter, FlowFilterName, FlowRunFilter,
                                                FlowRunFilterName, FlowRunFilterState,
                                                FlowRunFilterStateType)
    from prefect.client.schemas.objects import StateType
    from prefect.states import Crashed

    from gfcr.transport.executors import FLOW_NAME

    cutoff = None if before is None else datetime.fromtimestamp(before, tz=timezone.utc)
    crashed = 0
    with get_client(sync_client=True) as client:
        found = client.read_flow_runs(
            flow_filter=FlowFilter(name=FlowFilterName(any_=[FLOW_NAME])),
            flow_run_filter=FlowRunFilter(
                name=FlowRunFilterName(any_=[run_id]),
                state=FlowRunFilterState(type=FlowRunFilterStateType(
                    any_=[StateType(t) for t in UNFINISHED]))))
        for flow_run in found:
            began = flow_run.start_time or flow_run.created
            if cutoff is not None and began is not None and began > cutoff:
                continue  # started after the dead process took its lease: not its flow run
            client.set_flow_run_state(flow_run.id, Crashed(message=reason), force=True)
            crashed += 1
    return crashed
