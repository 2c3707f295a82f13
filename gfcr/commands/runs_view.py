"""``gfcr runs``: the store's runs beside their Prefect state.

Each gfcr flow run is named by its run id (:mod:`gfcr.launch.flow`), so a run's Prefect state is
that of the newest flow run of the ``gfcr`` flow with its name (a resumed run has
several). Flow runs the store does not hold yet (scheduled, pending, or crashed before
the run started) are listed too, with the store's columns empty. Prefect is asked only
when ``PREFECT_API_URL`` is set: the temporary local server would have to be started
for the question. A run the store shows crashed (its process died) whose flow run Prefect
still shows unfinished has that flow run set to Crashed here (:mod:`gfcr.transport.prefect_crash`),
so the dead run stops looking alive in Prefect's UI too.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from gfcr.report.rows import Row

PREFECT_LIMIT = 200
"""How many of the newest gfcr flow runs are read."""


def with_prefect(table: pa.Table, where: str | Path | None = None) -> tuple[pa.Table, str | None]:
    """The store's runs ``table`` (of the store at ``where``) with a ``prefect`` state column
    after ``status``, plus the gfcr flow runs the store lacks; and a note when Prefect could
    not be asked. Crashed runs whose flow run is unfinished are set Crashed in Prefect."""
    states, note = prefect_states()
    rows = table.to_pylist()
    for row in rows:
        row["prefect"] = states.pop(row["run_id"], "-")
        if row["status"] == "crashed" and _unfinished(row["prefect"]):
            row["prefect"], note = _crash(row, where, note)
    rows += [{**{name: None for name in table.column_names}, "run_id": name, "prefect": state}
             for name, state in states.items()]
    at = table.schema.get_field_index("status") + 1
    schema = table.schema.insert(at, pa.field("prefect", pa.string()))
    return pa.Table.from_pylist([{f.name: r.get(f.name) for f in schema} for r in rows],
                                schema=schema), note


def prefect_states() -> tuple[dict[str, str], str | None]:
    """{flow run name: state name} of the newest gfcr flow runs (newest first), or a note."""
    from prefect import get_client
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName
    from prefect.client.schemas.sorting import FlowRunSort
    from prefect.settings import PREFECT_API_URL

    from gfcr.transport.executors import FLOW_NAME

    url = PREFECT_API_URL.value()
    if not url:
        return {}, "Prefect states not shown: PREFECT_API_URL is unset"
    try:
        with get_client(sync_client=True) as client:
            found = client.read_flow_runs(
                flow_filter=FlowFilter(name=FlowFilterName(any_=[FLOW_NAME])),
                sort=FlowRunSort.START_TIME_DESC, limit=PREFECT_LIMIT)
    except Exception as e:  # unreachable or refusing: the store's view still stands
        return {}, f"Prefect states not shown: the API at {url} failed ({type(e).__name__}: {e})"
    states: dict[str, str] = {}
    for run in found:
        if run.name not in states and run.state is not None and run.state.name is not None:
            states[run.name] = run.state.name
    return states, None


def _unfinished(state: str) -> bool:
    from gfcr.transport.prefect_crash import UNFINISHED

    return state.upper() in UNFINISHED


def _crash(row: Row, where: str | Path | None, note: str | None) -> tuple[str, str | None]:
    """Set the crashed run's unfinished flow runs to Crashed; (its state now, the note)."""
    from gfcr.transport.prefect_crash import crash_flow_runs

    reason = row.get("error") or "the process running it died"
    crashed, failed = crash_flow_runs(row["run_id"], reason, before=_lease_taken(where, row["run_id"]))
    return ("Crashed" if crashed else row["prefect"]), (failed or note)


def _lease_taken(where: str | Path | None, run_id: str) -> float | None:
    """When the dead process took the run's lease (None: no lease, or no store named)."""
    if where is None:
        return None
    from gfcr.core.storage import backend

    row = backend().leases(where).get(run_id)
    return None if row is None else row.taken_at
