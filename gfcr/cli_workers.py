"""``gfcr engine-worker``: a long-lived process serving a pool's generate calls."""

from __future__ import annotations

from typing import Optional

import typer

POOL = "Run the generate stage on the engine workers of POOL (gfcr engine-worker)."
POOL_TIMEOUT = ("With --generate-pool or --score-pool: fail a step's call no worker "
                "finished in this many s.")
SCORE = "Run the scoring filter stages (Verify, ...) on the engine workers of POOL."
"""``gfcr run``'s help for its engine-worker options."""


def engine_worker(
    pool: str = typer.Option(..., "--pool", help="The pool to serve (runs name it with "
                                                 "--generate-pool)."),
    name: Optional[str] = typer.Option(None, help="This worker's name in task run logs "
                                                  "(default HOST:PID)."),
    timeout: Optional[float] = typer.Option(None, help="Stop after this many seconds "
                                                       "(default: serve until stopped)."),
    import_: list[str] = typer.Option([], "--import", metavar="MODULE",
                                      help="Import MODULE first: one that registers a task, "
                                           "policy or stage the runs use (repeat)."),
) -> None:
    """Serve the generate stage of any run that names POOL, keeping each run's policy
    loaded between its steps, and the scoring stages of any run that names it with
    --score-pool. Needs PREFECT_API_URL (a real Prefect server) and the run
    root's filesystem (weights and staged tables) and Prefect result storage shared with
    the runs."""
    from gfcr.remote.call import check_pool
    from gfcr.remote.worker import serve_pool

    try:
        check_pool(pool)
        serve_pool(pool, name=name, timeout=timeout, imports=tuple(import_))
    except (ValueError, RuntimeError, ImportError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2)
