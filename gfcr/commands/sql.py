"""The bodies of ``gfcr sql`` and ``gfcr runs``: read-only queries, printed.

A query runs in a worker thread while the main thread waits, so Ctrl-C reaches Python
at once; it interrupts the query (DuckDB's ``interrupt``) and the command exits with
code 130. Errors are one line that quotes at most an excerpt of the query. ``gfcr runs``
shows a run whose process died as ``crashed`` as soon as its lease has lapsed (or, on
this machine, its process is gone): see store.lease.
"""

from __future__ import annotations

import csv
import json
import signal
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Callable, TypeVar

from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:  # pyarrow loads with the store, when a query runs
    import pyarrow as pa

    from gfcr.core.storage import Lease, RunStore
    from gfcr.report.rows import Row

T = TypeVar("T")

FORMATS = ("table", "csv", "json")
INTERRUPT_SECONDS = 30.0
"""How long Ctrl-C keeps interrupting a query that has not ended (one that started after
an interrupt call runs on unless interrupted again)."""


class QueryFailed(Exception):
    """A query could not run; the message is one paragraph for the user."""


def check_format(fmt: str) -> None:
    if fmt not in FORMATS:
        raise QueryFailed(f"--format {fmt!r} is not one of {', '.join(FORMATS)}")


def query(where: str | Path, sql: str) -> pa.Table:
    """Run ``sql`` on the store at ``where`` (read-only); Ctrl-C interrupts it."""
    from gfcr.core.storage import backend

    lake = backend()
    opened: list[RunStore] = []

    def work() -> pa.Table:
        with lake.open(where, read_only=True, create=False) as s:
            opened.append(s)
            if stop.is_set():
                raise KeyboardInterrupt
            return s.sql(sql)

    def interrupt() -> None:
        for s in opened:
            s.interrupt()
    stop = threading.Event()
    try:
        return interruptible(work, interrupt, stop)
    except lake.errors + (ValueError,) as e:
        raise QueryFailed(str(e)) from e
    except KeyboardInterrupt:
        raise
    except Exception as e:  # duckdb parser/binder/runtime errors
        if _interrupted(e):
            raise KeyboardInterrupt from e
        raise QueryFailed(f"query failed: {_short(e)}") from e


def _short(exc: BaseException, limit: int = 300) -> str:
    """The error on one line of at most ``limit`` characters (DuckDB's messages quote the
    query's line, which can be the whole query)."""
    flat = " ".join(str(exc).split())
    return flat if len(flat) <= limit else flat[:limit] + "..."


def _interrupted(exc: BaseException) -> bool:
    """Whether DuckDB's error is Ctrl-C's doing: an interrupted query, or its connection
    closed under it (only the interrupt closes a query's own read-only connection; under
    load the error could reach the caller before the signal's handler had run: 1 run in 8
    of tests/gfcr/test_sql_readonly.py's Ctrl-C test at load 4)."""
    import duckdb

    text = str(exc).lower()
    return isinstance(exc, duckdb.InterruptException) or (
        isinstance(exc, duckdb.Error) and ("interrupted" in text or "connection already closed" in text))


def interruptible(work: Callable[[], T], interrupt: Callable[[], None],
                  stop: threading.Event) -> T:
    """``work()`` in a thread, with SIGINT (Ctrl-C) handled by this thread: it sets
    ``stop``, calls ``interrupt`` and raises KeyboardInterrupt once the work has ended.
    Every DuckDB call runs in the worker, so DuckDB never swaps the handler."""
    done: list[T] = []
    failed: list[BaseException] = []

    def run() -> None:
        try:
            done.append(work())
        except BaseException as e:  # noqa: BLE001 - handed to the waiting thread
            failed.append(e)

    def on_sigint(signum: int, frame: FrameType | None) -> None:
        stop.set()
        interrupt()
    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        worker = threading.Thread(target=run, name="gfcr-sql", daemon=True)
        worker.start()
        while worker.is_alive():
            worker.join(0.1)
            if stop.is_set():
                deadline = time.monotonic() + INTERRUPT_SECONDS
                while worker.is_alive() and time.monotonic() < deadline:
                    interrupt()  # again and again: the query may start after a call
                    worker.join(0.1)
                raise KeyboardInterrupt
    finally:
        signal.signal(signal.SIGINT, previous)
    if stop.is_set():  # what the interrupted work raised (DuckDB: "interrupted", or
        raise KeyboardInterrupt  # "connection already closed" mid-open) is Ctrl-C's doing
    if failed:
        raise failed[0]
    return done[0]


def runs_table(where: str | Path) -> pa.Table:
    """The store's runs, with ``status`` as a reader should see it: ``crashed`` for a run
    the store shows running whose lease is gone or stale."""
    import pyarrow as pa

    from gfcr.core.storage import backend

    lake = backend()

    try:
        with lake.open(where, read_only=True, create=False) as s:
            table = lake.reads(s).runs()
            held = lake.leases(where)
            rows = table.to_pylist()
            for row in rows:
                if row["status"] == "running":
                    _crash_status(row, held.get(row["run_id"]))
            if any(r["status"] == "crashed?" for r in rows):  # it may have just ended
                now = {r["run_id"]: r for r in lake.reads(s).runs().to_pylist()}
                for row in rows:
                    if row["status"] == "crashed?":
                        fresh = now[row["run_id"]]
                        row.update(fresh if fresh["status"] != "running" else
                                   {"status": "crashed"})
    except lake.errors as e:
        raise QueryFailed(str(e)) from e
    return pa.Table.from_pylist(rows, schema=table.schema)


def _crash_status(row: Row, lease: Lease | None) -> None:
    why = "no process holds its lease" if lease is None else lease.stale()
    if why is not None:
        row["status"] = "crashed?"
        row["error"] = row["error"] or f"the process running it died ({why})"


def print_table(table: pa.Table, fmt: str, out: Console, *, keep: tuple[str, ...] = ()) -> None:
    """``table`` as a rich table, CSV (``\\n`` line ends) or JSON; ``keep``: columns a
    narrow terminal must not cut (run ids)."""
    rows = table.to_pylist()
    if fmt == "json":
        print(json.dumps(rows, default=str))
    elif fmt == "csv":
        writer = csv.DictWriter(sys.stdout, fieldnames=table.column_names, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    else:
        view = Table()
        for name in table.column_names:
            width = max([len(name), *(len(str(r[name])) for r in rows)]) if name in keep else None
            view.add_column(name, no_wrap=name in keep, min_width=width,
                            overflow="fold")
        for row in rows:
            view.add_row(*(str(v) for v in row.values()))
        out.print(view)
