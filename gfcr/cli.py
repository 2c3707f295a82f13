"""The ``gfcr`` command: run pipelines, query the rollout store, list runs."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn, Optional

import typer
from rich.console import Console
from rich.markup import escape

from gfcr.commands import (deploy as cli_deploy, export as cli_export, model as cli_model,
                           store as cli_store, workers as cli_workers)
from gfcr.commands import replay as cli_replay
from gfcr.commands.summary import print_summary

if TYPE_CHECKING:  # the run's types, imported when a command runs (a fast --help)
    from gfcr.commands.warnings_log import WarningsLog
    from gfcr.launch.hooks import RunSummary
    from gfcr.launch.request import Launch, RunRequest
    from gfcr.ui.server import UiServer
    from gfcr.transport.progress import ProgressBars

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="gfcr: declarative GFCR rollout pipelines for LLM RL.")
err = Console(stderr=True)
out = Console()

ROOT_HELP = "Run root: the store, MLflow database, caches (default .gfcr)."


def quiet_prefect(verbose: bool = False) -> None:
    """Prefect settings of ``gfcr run`` (benchmarks use them too). Prefect reads its
    settings at import: set them before anything imports it."""
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("DO_NOT_TRACK", "1")
    # the temporary local server needs more than Prefect's 20 s on a busy 2-core machine
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
    if not verbose:
        os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    # the console shows gfcr's own progress and errors (gfcr.commands.errors); Prefect's lines
    # (a failed task's traceback, once per retry) only with --verbose or --debug
    if not verbose and os.environ.get("GFCR_DEBUG") != "1":
        os.environ.setdefault("PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL", "CRITICAL")


STORE_HELP = ("Store folder, or postgresql://HOST/DB?data_path=SHARED_FOLDER (default "
              "ROOT/store).")
TRACKING_HELP = "MLflow tracking URI, e.g. http://HOST:5000 (default: SQLite under ROOT)."
PIPELINE_HELP = ("Registered name, .py or .yaml file (default: 'default', or with --resume "
                 "the run's own pipeline).")
TRACKER_HELP = ("mlflow (default), wandb or tensorboard; repeat for several (wandb and "
                "tensorboard are extras: pip install 'gfcr[wandb]').")
EXPORT_HELP = ("When the run finishes, export its policy to DIR (as `gfcr export`; a LoRA "
               "adapter merged).")
RESUME_HELP = ("Continue run RUN_ID from its newest checkpoint (README 'Resume'). Without "
               "PIPELINE it goes on with the run's own stored pipeline; --steps may extend it and "
               "--set checkpoint.* may change, anything else is refused.")


@app.command()
def run(
    pipeline: Optional[str] = typer.Argument(None, help=PIPELINE_HELP),
    steps: Optional[int] = typer.Option(None, help="Override the pipeline's step count."),
    set_: list[str] = typer.Option([], "--set", help="Override: stage.field=value (repeat)."),
    resume: Optional[str] = typer.Option(None, "--resume", metavar="RUN_ID", help=RESUME_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as one JSON object."),
    root: Path = typer.Option(Path(".gfcr"), help=ROOT_HELP),
    store: Optional[str] = typer.Option(None, help=STORE_HELP),
    tracking: Optional[str] = typer.Option(None, help=TRACKING_HELP),
    executor: str = typer.Option("prefect", help="prefect (default) or local."),
    track: bool = typer.Option(True, help="Track the run (--no-track: in no tracker)."),
    tracker: list[str] = typer.Option(["mlflow"], "--tracker", help=TRACKER_HELP),
    export: Optional[Path] = typer.Option(None, "--export", metavar="DIR", help=EXPORT_HELP),
    verbose: bool = typer.Option(False, "-v", "--verbose", help="Show Prefect's logs."),
    generate_pool: Optional[str] = cli_workers.GENERATE_POOL,  # removed: fails naming --fleet
    generate_timeout: Optional[float] = typer.Option(None, help=cli_workers.POOL_TIMEOUT),
    score_pool: Optional[str] = typer.Option(None, metavar="POOL", help=cli_workers.SCORE),
    fleet: list[str] = typer.Option([], "--fleet", metavar="URL", help=cli_workers.FLEET,
                                    callback=cli_workers.checked_fleet),
    placement: Optional[Path] = typer.Option(None, "--placement", metavar="FILE",
                                             help=cli_workers.PLACEMENT),
    ui: bool = typer.Option(False, "--ui", help="Serve `gfcr ui` on the run's store beside it "
                            "(127.0.0.1, --ui-port) and print its URL."),
    ui_port: int = typer.Option(8765, min=0, max=65535, help="Port of --ui (0: any free one)."),
) -> None:
    """Run a pipeline (the embedded default if none is named), or resume a run.

    Ctrl-C or SIGTERM stops it after the step under way, checkpointed; a second at once."""
    quiet_prefect(verbose)
    from gfcr.launch.request import RunRequest

    _check_trackers(tracker if track else [])
    request = RunRequest(pipeline=pipeline if pipeline or resume else "default",
                         overrides=tuple(set_), steps=steps, run_id=resume,
                         resume=resume is not None, root=str(root.resolve()), store=store,
                         tracking=tracking, track=track, trackers=tuple(tracker),
                         export=None if export is None else str(export.resolve()))
    launch = _launch(request, executor, placement, fleet, score_pool, generate_timeout)
    from gfcr.transport.progress import ProgressBars
    bars = ProgressBars(launch.pipeline.steps, console=err, quiet=as_json)
    viewer = _start_ui(store or root / "store", ui_port, launch.run_id) if ui else None
    try:
        summary, warned = _execute(launch, executor, bars, root, store, track)
    finally:
        if viewer is not None:
            viewer.shutdown()
            viewer.server_close()
    print_summary(summary, out, as_json=as_json)
    if not as_json and warned.note():
        err.print(warned.note(), markup=False, highlight=False, soft_wrap=True)


def _execute(launch: Launch, executor: str, bars: ProgressBars, root: Path,
             store: Optional[str], track: bool) -> tuple[RunSummary, WarningsLog]:
    """Run ``launch``; its summary and where its library warnings went (a log file under
    ROOT/runs/RUN_ID, not the terminal). A failure ends the command with its message."""
    from gfcr.commands import run as cli_run
    from gfcr.commands.errors import explain
    from gfcr.commands.exits import RunExited
    from gfcr.commands.warnings_log import warnings_to_log
    from gfcr.core.names import UnsafeName
    from gfcr.core.storage import backend
    from gfcr.checkpoints.cancel import RunCancelled
    from gfcr.checkpoints.resume import ResumeError

    try:
        with warnings_to_log(root.resolve() / "runs" / launch.run_id / "warnings.log") as warned:
            summary = cli_run.run(launch, executor, hooks=[bars], notify=cli_run.stopping(err))
        return summary, warned
    except RunCancelled as e:
        err.print(f"[yellow]cancelled:[/yellow] {e}", markup=True, highlight=False, soft_wrap=True)
        raise typer.Exit(130)
    except KeyboardInterrupt:
        err.print(f"stopped at once; continue with: gfcr run --resume {launch.run_id}")
        _exit_now(130)
    except (ResumeError, UnsafeName, RunExited) + backend().errors as e:  # LeaseHeld
        _fail(str(e))
    except Exception as e:  # a read-only or full disk: one paragraph naming the path
        _fail(explain(e, root.resolve(), store=store, tracking=track) or _reraise(e))
    finally:
        bars.close()


def _start_ui(where: str | Path, port: int, run_id: str) -> UiServer:
    """``gfcr run --ui``: the UI server on the run's store, in a thread; its URL printed.
    The store is created by the run, so the server opens it on its first page."""
    from gfcr.commands.ui import start

    server = start(where, "127.0.0.1", port, thread=True)
    err.print(f"gfcr ui: {server.url}runs/{run_id}", markup=False, highlight=False, soft_wrap=True)
    return server


def _exit_now(code: int) -> NoReturn:
    """End the process at once (a second Ctrl-C): an orderly exit waits for the run's
    threads (a commit, Prefect's task runner), which a user who pressed Ctrl-C twice does
    not want; the store's commits are atomic, child processes end with this one, and the
    run reads as crashed, so ``--resume`` continues it."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _check_trackers(names: list[str]) -> None:
    """An unknown tracker, or one whose package is missing, refused before the run."""
    from gfcr.tracking.trackers import trackers

    try:
        trackers(tuple(names))
    except ValueError as e:
        _fail(str(e))


def _launch(request: RunRequest, executor: str, placement: Optional[Path],
            fleet: list[str], score_pool: Optional[str],
            timeout_s: Optional[float]) -> Launch:
    """``gfcr run``'s request resolved, once: its pipeline (a resume's stored one when
    none is named) with its overrides, and its placement settled from the pipeline, the
    placement file and the flags (gfcr.launch.placement); a clear error otherwise."""
    from gfcr.core.names import UnsafeName, check_run_id
    from gfcr.core.pipeline import PipelineError
    from gfcr.core.storage import backend
    from gfcr.launch import placement as place
    from gfcr.launch.ledger import open_ledger
    from gfcr.launch.request import resolve
    from gfcr.checkpoints.resume import ResumeError
    from gfcr.transport.executors import named

    lake = backend()
    try:
        named(executor)
        file = None if placement is None else place.of_file(placement)
        sources = [*([file] if file else []),
                   place.of_flags(fleet, score_pool, timeout_s, file)]
        if not request.resume:
            return resolve(request, None, sources)
        check_run_id(request.run_id or "")
        where = request.store or Path(request.root) / "store"
        stored = open_ledger(where, read_only=True)
        try:
            return resolve(request, stored, sources)
        finally:
            stored.close()
    except lake.errors as e:
        _fail(f"--resume {request.run_id!r}: {e}")
    except (PipelineError, ResumeError, UnsafeName, ValueError) as e:
        _fail(str(e))


@app.command()
def sql(
    query: Optional[str] = typer.Argument(None, help="A read-only SQL statement."),
    root: Path = typer.Option(Path(".gfcr"), help=ROOT_HELP),
    store: Optional[str] = typer.Option(None, help="Store folder or URI (default ROOT/store)."),
    fmt: str = typer.Option("table", "--format", help="table, csv or json."),
    duckdb: bool = typer.Option(False, "--duckdb", help="Print DuckDB statements that open "
                                "the store read-only, for `duckdb -init FILE` or any client."),
    ui: bool = typer.Option(False, "--ui", help="Open DuckDB's local UI on the store "
                            "(duckdb-extension-ui); Ctrl-C stops it."),
    port: int = typer.Option(4213, help="Port of the UI server (--ui)."),
) -> None:
    """Query the rollout store (tables rollouts, steps, runs and the shipped views), or open
    a DuckDB session on it (--duckdb, --ui)."""
    from gfcr.commands.sql import QueryFailed, check_format, print_table
    from gfcr.commands.sql import query as run_query

    where = store or root / "store"
    if duckdb or ui:
        if query is not None:
            _fail("give a query or --duckdb/--ui, not both")
        return cli_report.duckdb_session(where, ui, port)
    if query is None:
        _fail("give a read-only SQL statement, or --duckdb or --ui (a DuckDB session on the store)")
    try:
        check_format(fmt)
        result = run_query(where, query)
    except QueryFailed as e:
        _fail(str(e))
    except KeyboardInterrupt:
        err.print("interrupted: the query was stopped")
        raise typer.Exit(130)
    print_table(result, fmt, out)


@app.command()
def runs(root: Path = typer.Option(Path(".gfcr"), help=ROOT_HELP),
         store: Optional[str] = typer.Option(None, help=STORE_HELP),
         fmt: str = typer.Option("table", "--format", help="table, csv or json.")) -> None:
    """List the runs in the store (a run whose process died shows as crashed), with each
    one's Prefect state when PREFECT_API_URL is set (a crashed run's flow run that Prefect
    still shows running is set to Crashed)."""
    from gfcr.commands.runs_view import with_prefect
    from gfcr.commands.sql import QueryFailed, check_format, print_table, runs_table

    try:
        check_format(fmt)
        where = store or root / "store"
        table, note = with_prefect(runs_table(where), where)
    except QueryFailed as e:
        _fail(str(e))
    if note and fmt == "table":
        err.print(note)
    print_table(table, fmt, out, keep=("run_id",))

app.command()(cli_export.export)
app.command()(cli_deploy.deploy)
app.command()(cli_deploy.submit)
app.command("engine-worker")(cli_workers.engine_worker)
app.add_typer(cli_workers.engine_app, name="engine")
app.add_typer(cli_model.app, name="model")


store_app = typer.Typer(no_args_is_help=True, help="Export or compact a rollout store.")
app.add_typer(store_app, name="store")


store_app.command("export")(cli_store.export)
store_app.command("compact")(cli_store.compact)


app.add_typer(cli_replay.app, name="replay")


def _register_stages() -> None:
    from gfcr.commands.envs import envs
    from gfcr.commands.stages import stages
    app.command("stages")(stages)
    app.command("envs")(envs)


_register_stages()


@app.command()
def show(pipeline: str = typer.Argument("default")) -> None:
    """Print a pipeline as YAML (validated), with its spec hash."""
    from gfcr.core.loading import load
    from gfcr.core.pipeline import PipelineError

    try:
        spec = load(pipeline)
    except PipelineError as e:
        _fail(str(e))
    print(f"# spec hash {spec.spec_hash()}\n{spec.to_yaml()}", end="")


def _reraise(exc: BaseException) -> str:
    raise exc


def _fail(message: str) -> NoReturn:
    err.print(f"[red]error:[/red] {escape(message)}", markup=True, highlight=False,
              soft_wrap=True)
    raise typer.Exit(2)


from gfcr.commands import report as cli_report  # noqa: E402 (report, doctor; sql --duckdb)

cli_report.register(app)


def _register_ui() -> None:
    from gfcr.commands.ui import ui
    app.command("ui")(ui)


_register_ui()


def main() -> None:
    from gfcr.commands.guard import guarded

    guarded(app)


if __name__ == "__main__":
    main()
