"""``gfcr runs``: the store's runs beside their Prefect state.

Each gfcr flow run is named by its run id (:mod:`gfcr.flow`), so a run's Prefect state is
that of the newest flow run of the ``gfcr`` flow with its name (a resumed run has
several). Flow runs the store does not hold yet (scheduled, pending, or crashed before
the run started) are listed too, with the store's columns empty. Prefect is asked only
when ``PREFECT_API_URL`` is set: the temporary local server would have to be started
for the question.
"""

from __future__ import annotations

import pyarrow as pa

PREFECT_LIMIT = 200
"""How many of the newest gfcr flow runs are read."""


def with_prefect(table: pa.Table) -> tuple[pa.Table, str | None]:
    """The store's runs ``table`` with a ``prefect`` state column after ``status``, plus
    the gfcr flow runs the store lacks; and a note when Prefect could not be asked."""
    states, note = prefect_states()
    rows = table.to_pylist()
    for row in rows:
        row["prefect"] = states.pop(row["run_id"], "-")
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

    from gfcr.executors import FLOW_NAME

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
