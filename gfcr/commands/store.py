"""``gfcr store export`` and ``gfcr store compact``.

Export takes typed filters (``--run``, ``--step``, ``--kept``, ``--match COLUMN=VALUE``),
which the store converts to each column's type and binds as parameters: no SQL text of
the user's reaches a query, and the query runs on the sandboxed read-only connection
``gfcr sql`` uses (store.maintenance.export). ``--where`` (SQL text spliced into the
query) is gone; giving it says what replaced it.
"""

from __future__ import annotations

from pathlib import Path
from typing import NoReturn, Optional

import typer
from rich.console import Console
from rich.markup import escape

err = Console(stderr=True)
ROOT_HELP = "Run root: the store, MLflow database, caches (default .gfcr)."
STORE_HELP = "Store folder or URI (default ROOT/store)."


def export(
    dest: Path = typer.Argument(..., help="File (parquet, jsonl) or folder (hf) to write."),
    fmt: str = typer.Option("parquet", "--format", help="parquet, jsonl or hf (datasets)."),
    table: str = typer.Option("rollouts", help="A table or view of the store."),
    run: Optional[str] = typer.Option(None, "--run", metavar="RUN_ID",
                                      help="Only this run's rows."),
    step: Optional[str] = typer.Option(None, help="Only this step (N) or steps (FIRST:LAST)."),
    kept: Optional[bool] = typer.Option(None, "--kept/--not-kept",
                                        help="Only rows kept (or not kept) for training."),
    match: list[str] = typer.Option([], "--match", metavar="COLUMN=VALUE",
                                    help="Only rows whose COLUMN equals VALUE (repeat)."),
    where: Optional[str] = typer.Option(None, hidden=True),
    root: Path = typer.Option(Path(".gfcr"), help=ROOT_HELP),
    store: Optional[str] = typer.Option(None, help=STORE_HELP),
) -> None:
    """Export rows of the store (read-only) to Parquet, JSONL or a Hugging Face dataset."""
    from gfcr.core.storage import backend

    if where is not None:
        _fail("--where (SQL text) is no longer accepted: filter with --run RUN_ID, "
              "--step N or FIRST:LAST, --kept/--not-kept and --match COLUMN=VALUE")
    filters = _filters(run, step, kept, match)
    lake = backend()
    try:
        with lake.open(store or root / "store", read_only=True, create=False) as s:
            path = lake.export(s, dest, format=fmt, table=table, match=filters)
    except lake.errors + (ValueError, FileNotFoundError) as e:
        _fail(str(e))
    err.print(f"wrote {path}")


def _filters(run: Optional[str], step: Optional[str], kept: Optional[bool],
             match: list[str]) -> dict[str, object]:
    """The column -> value conditions the options ask for (values stay text where the
    store converts them to the column's type)."""
    filters: dict[str, object] = {}
    for item in match:
        column, sep, value = item.partition("=")
        if not sep or not column.strip():
            _fail(f"--match {item!r} must be COLUMN=VALUE")
        filters[column.strip()] = value
    if run is not None:
        filters["run_id"] = run
    if step is not None:
        first, sep, last = step.partition(":")
        filters["step"] = (first, last) if sep else step
    if kept is not None:
        filters["kept"] = kept
    return filters


def compact(
    root: Path = typer.Option(Path(".gfcr"), help=ROOT_HELP),
    store: Optional[str] = typer.Option(None, help=STORE_HELP),
) -> None:
    """Merge the store's small Parquet files; time travel keeps working. Refused when the
    catalog lists data files outside the store."""
    from gfcr.core.storage import backend

    lake = backend()
    try:
        with lake.open(store or root / "store", create=False) as s:
            result = lake.compact(s)
    except lake.errors as e:
        _fail(str(e))
    err.print(f"data files: {result.files_before} -> {result.files_after}")


def _fail(message: str) -> NoReturn:
    err.print(f"[red]error:[/red] {escape(message)}", markup=True, highlight=False,
              soft_wrap=True)
    raise typer.Exit(2)
