"""``gfcr report``, ``gfcr doctor`` and ``gfcr sql --duckdb/--ui``: seeing a run, diagnosing
it, and opening its store in DuckDB's own tools. Each reads the store read-only."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn, Optional

import typer
from rich.console import Console

if TYPE_CHECKING:  # the doctor loads when the command runs
    from gfcr.doctor.checks import Finding

err = Console(stderr=True)
out = Console()

ROOT_HELP = "Run root: the store, MLflow database, caches (default .gfcr)."
STORE_HELP = "Store folder or URI (default ROOT/store)."


def _fail(message: str) -> NoReturn:
    err.print(f"[red]error:[/red] {message}", markup=True, highlight=False)
    raise typer.Exit(2)


def report(
    run_ids: list[str] = typer.Argument(..., metavar="RUN_ID...", help="One run, or several to compare."),
    out_file: Optional[Path] = typer.Option(None, "--out", help="HTML file to write "
                                            "(default report-RUN_ID.html here)."),
    root: Path = typer.Option(Path(".gfcr"), help=ROOT_HELP),
    store: Optional[str] = typer.Option(None, help=STORE_HELP),
) -> None:
    """Write one self-contained HTML page (works offline) about one or several runs."""
    from gfcr.core.storage import backend
    from gfcr.report import ReportError, write_report

    more = f"+{len(run_ids) - 1}" if len(run_ids) > 1 else ""
    target = out_file or Path(f"report-{run_ids[0]}{more}.html")
    try:
        path = write_report(store or root / "store", run_ids, target)
    except (ReportError,) + backend().errors as e:
        _fail(str(e))
    except OSError as e:
        _fail(f"cannot write the report to {str(target)!r}: {e}")
    err.print(f"wrote {path}")


def doctor(
    run_id: str = typer.Argument(..., help="Run to diagnose."),
    as_json: bool = typer.Option(False, "--json", help="Print the findings as a JSON list."),
    root: Path = typer.Option(Path(".gfcr"), help=ROOT_HELP),
    store: Optional[str] = typer.Option(None, help=STORE_HELP),
) -> None:
    """Check a run for rollout pathologies (README 'Diagnose a run'); exit 1 on a serious one."""
    from gfcr.core.storage import backend
    from gfcr.doctor import diagnose, serious
    from gfcr.report import ReportError, open_store

    try:
        with open_store(store or root / "store") as s:
            findings = diagnose(s, run_id)
    except (ReportError,) + backend().errors as e:
        _fail(str(e))
    if as_json:
        print(json.dumps([f.as_dict() for f in findings], default=str))
    else:
        _print_findings(run_id, findings)
    if serious(findings):
        raise typer.Exit(1)


def _print_findings(run_id: str, findings: list[Finding]) -> None:
    if not findings:
        out.print(f"gfcr doctor {run_id}: no finding")
        return
    colour = {"serious": "red", "warning": "yellow", "info": "blue"}
    out.print(f"gfcr doctor {run_id}: {len(findings)} finding(s)")
    for f in findings:
        out.print(f"\n[bold {colour[f.severity]}]{f.severity.upper()}[/] [bold]{f.check}[/]: {f.title}",
                  highlight=False)
        out.print(f"  evidence:  {f.evidence}", highlight=False, markup=False)
        out.print(f"  threshold: {f.threshold}", highlight=False, markup=False)
        out.print(f"  try:       {f.advice}", highlight=False, markup=False)


def duckdb_session(where: str | Path, ui: bool, port: int) -> None:
    """``gfcr sql --duckdb`` and ``--ui``: print the DuckDB statements that open the store at
    ``where`` read-only (extensions loaded from the installed packages, the catalog
    attached, the shipped views created), for the DuckDB CLI (`duckdb -init FILE`) or any
    DuckDB client; or run them in DuckDB's local UI server and wait for Ctrl-C."""
    from gfcr.commands.duck_session import StoreSqlError, statements, ui_server

    try:
        script = statements(where)
    except StoreSqlError as e:
        _fail(str(e))
    if not ui:
        print(script)
        return
    try:
        url = ui_server(script, port)
    except StoreSqlError as e:
        _fail(str(e))
    err.print(f"DuckDB UI on the store at {url} (Ctrl-C stops it)")
    import time
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass


def register(app: typer.Typer) -> None:
    """Add the commands to the ``gfcr`` app."""
    app.command()(report)
    app.command()(doctor)
