"""``gfcr report``: one self-contained HTML page about one or several runs, from the store.

:func:`report_html` reads an open store (read-only queries only) and renders the page;
:func:`write_report` opens a store read-only and writes the page to a file. Data:
:mod:`gfcr.report.data`; charts: :mod:`gfcr.report.svg`; the page: :mod:`gfcr.report.page`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from gfcr.core.storage import RunStore
from gfcr.report.data import ReportError, RunData, check_schema, load_run
from gfcr.report.page import headline, render

__all__ = ["ReportError", "RunData", "headline", "load_runs", "open_store", "report_html", "write_report"]


def load_runs(store: RunStore, run_ids: Sequence[str], *, samples: bool = True) -> list[RunData]:
    """Each run's data; ReportError for an older store, an unknown run or an empty one."""
    if not run_ids:
        raise ReportError("name at least one run id (gfcr runs lists them)")
    check_schema(store)
    return [load_run(store, run_id, samples=samples) for run_id in dict.fromkeys(run_ids)]


def report_html(store: RunStore, run_ids: Sequence[str]) -> str:
    """The report page of ``run_ids`` (one, or several to compare) in the open ``store``."""
    return render(load_runs(store, run_ids), store=str(store.uri))


def open_store(store_uri: str | os.PathLike[str]) -> RunStore:
    """The store at ``store_uri``, read-only. A store older than this gfcr, whose tables the
    shipped views cannot bind, raises ReportError saying so (StoreError: no store there)."""
    import duckdb

    from gfcr.core.storage import backend

    try:
        return backend().open(store_uri, read_only=True, create=False)
    except (duckdb.BinderException, duckdb.CatalogException) as e:
        first = str(e).splitlines()[0]
        raise ReportError(f"store {os.fspath(store_uri)!r} has an older schema than this gfcr: "
                          f"its tables do not fit the store's views ({first}). Read it with the "
                          "gfcr version that wrote it.") from e


def write_report(store_uri: str | os.PathLike[str], run_ids: Sequence[str], out: Path) -> Path:
    """Open the store at ``store_uri`` read-only, write the report of ``run_ids`` to ``out``
    (written to a temporary name and renamed, so a reader never sees half a page)."""
    with open_store(store_uri) as store:
        html = report_html(store, run_ids)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    tmp.write_text(html, encoding="utf-8")
    tmp.replace(out)
    return out
