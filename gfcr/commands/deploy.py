"""``gfcr deploy``, ``gfcr submit`` and the Prefect side of ``gfcr runs`` (gfcr.launch.deploy)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NoReturn, Optional

import typer
from rich.console import Console

err = Console(stderr=True)

JOB_VARIABLE_HELP = ("A work-pool job variable KEY=VALUE (VALUE is JSON, else text), e.g. "
                     "--job-variable working_dir=/scratch (repeat).")
ENV_HELP = ("An environment variable of the run's process, KEY=VALUE, e.g. "
            "CUDA_VISIBLE_DEVICES=0 (repeat); it also picks the GPU concurrency limit.")


def deploy(
    pipeline: str = typer.Argument(..., help="Registered name, .py or .yaml file."),
    pool: str = typer.Option(..., help="Work pool (a process pool: prefect work-pool create "
                                       "POOL --type process)."),
    name: Optional[str] = typer.Option(None, help="Deployment name (default: the pipeline's)."),
    cron: Optional[str] = typer.Option(None, help="Schedule: a cron expression."),
    interval: Optional[float] = typer.Option(None, help="Schedule: every SECONDS."),
    set_: list[str] = typer.Option([], "--set", help="Override: stage.field=value (repeat)."),
    steps: Optional[int] = typer.Option(None, help="Override the pipeline's step count."),
    root: Path = typer.Option(Path(".gfcr"), help="Run root every worker sees (shared storage)."),
    store: Optional[str] = typer.Option(None, help="Store folder, or postgresql://HOST/DB"
                                                   "?data_path=SHARED_FOLDER (default ROOT/store)."),
    tracking: Optional[str] = typer.Option(None, help="MLflow tracking URI (default: SQLite "
                                                      "under ROOT)."),
    env: list[str] = typer.Option([], "--env", help=ENV_HELP),
    job_variable: list[str] = typer.Option([], "--job-variable", help=JOB_VARIABLE_HELP),
) -> None:
    """Create or update a Prefect deployment of a pipeline on a work pool (validated first)."""
    from gfcr.core.pipeline import PipelineError
    from gfcr.launch.deploy import DeployError
    from gfcr.launch.deploy import deploy as create

    try:
        variables = _pairs(job_variable, "--job-variable", parse=True)
        if env:
            variables["env"] = {**variables.get("env", {}), **_pairs(env, "--env")}
        done = create(pipeline, pool=pool, name=name, cron=cron, interval=interval,
                      overrides=set_, steps=steps, root=root, store=store, tracking=tracking,
                      job_variables=variables)
    except (PipelineError, DeployError) as e:
        fail(str(e))
    err.print(f"deployed {done.name} (pipeline {done.pipeline}, spec hash {done.spec_hash}) "
              f"on pool {pool!r}; start a run with: gfcr submit {done.name}", soft_wrap=True)
    print(done.name)


def submit(
    deployment: str = typer.Argument(..., help="Deployment: NAME or gfcr/NAME."),
    set_: list[str] = typer.Option([], "--set", help="Override: stage.field=value (repeat)."),
    resume: Optional[str] = typer.Option(None, "--resume", metavar="RUN_ID",
                                         help="Continue this run of the deployment's store."),
) -> None:
    """Start a run of a deployment now; prints its run id (the flow run's name)."""
    from gfcr.core.pipeline import PipelineError
    from gfcr.launch.deploy import DeployError
    from gfcr.launch.deploy import submit as start
    from gfcr.checkpoints.resume import ResumeError

    try:
        done = start(deployment, overrides=set_, resume=resume)
    except (PipelineError, ResumeError, DeployError) as e:
        fail(str(e))
    err.print(f"submitted run {done.run_id} of {done.deployment} (flow run {done.flow_run_id})",
              soft_wrap=True)
    print(done.run_id)


def _pairs(items: list[str], option: str, *, parse: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            fail(f"{option} {item!r} must be KEY=VALUE")
        out[key] = _value(value) if parse else value
    return out


def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def fail(message: str) -> NoReturn:
    err.print(f"[red]error:[/red] {message}", markup=True, highlight=False, soft_wrap=True)
    raise typer.Exit(2)
