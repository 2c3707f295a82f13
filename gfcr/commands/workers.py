"""``gfcr engine-worker``: a long-lived process serving a pool's score calls; ``gfcr engine
serve``: a fleet's inference server; ``gfcr run``'s help for both."""

from __future__ import annotations

from typing import Optional

import typer

POOL = "Removed (issue 24): generate on a fleet with --fleet URL (gfcr engine serve)."
POOL_TIMEOUT = ("With a fleet: each request's deadline; with a score pool: fail a step's "
                "call no worker finished in this many s (default: the fleet's 300, the "
                "pool's 600).")
PLACEMENT = ("A YAML file of where the generator, learner and scorer run (generator: a "
             "fleet's urls..., learner: ranks..., scorer: a pool...; gfcr.launch.placement). "
             "A setting given here and by the pipeline or a flag must agree.")
SCORE = ("Run the scoring filter stages (Verify, ...) on the workers of POOL "
         "(gfcr engine-worker).")
FLEET = ("Generate on the vLLM server at URL (started with `gfcr engine serve`; repeat "
         "for a fleet; its key: the file GFCR_FLEET_KEY_FILE names); --generate-timeout "
         "is each request's deadline.")
"""``gfcr run``'s help for its placement options (gfcr.launch.placement)."""


def removed_generate_pool(pool: Optional[str]) -> Optional[str]:
    """``gfcr run --generate-pool``'s callback: the option is refused, naming the fleet
    that replaced the engine-worker generate path (gfcr.launch.placement.REMOVED)."""
    if pool is not None:
        from gfcr.launch.placement import REMOVED

        raise typer.BadParameter(REMOVED)
    return pool


def checked_fleet(urls: list[str]) -> list[str]:
    """``gfcr run --fleet``'s callback: the URLs and the fleet's key file checked before
    any work (a bad one is a usage error, exit code 2)."""
    if not urls:
        return urls
    from gfcr.transport.fleet import check_urls
    from gfcr.transport.fleet_gate import fleet_key

    try:
        fleet_key(None)
        return list(check_urls(urls))
    except ValueError as e:
        raise typer.BadParameter(str(e))


GENERATE_POOL: Optional[str] = typer.Option(None, metavar="POOL", help=POOL, hidden=True,
                                  callback=removed_generate_pool)
"""``gfcr run --generate-pool``: hidden, and refused when given (:func:`removed_generate_pool`)."""


def engine_worker(
    pool: str = typer.Option(..., "--pool", help="The pool to serve (runs name it with "
                                                 "--score-pool)."),
    name: Optional[str] = typer.Option(None, help="This worker's name in task run logs "
                                                  "(default HOST:PID)."),
    timeout: Optional[float] = typer.Option(None, help="Stop after this many seconds "
                                                       "(default: serve until stopped)."),
    import_: list[str] = typer.Option([], "--import", metavar="MODULE",
                                      help="Import MODULE first: one that registers a task, "
                                           "policy or stage the runs use (repeat)."),
    key_file: Optional[str] = typer.Option(None, "--key-file", metavar="PATH",
                                           help="The pool's key (runs of the pool sign "
                                                "their calls with it); default: the file "
                                                "GFCR_POOL_KEY_FILE names."),
    allow_ref: list[str] = typer.Option([], "--allow-ref", metavar="MODULE:NAME",
                                        help="Code the calls may name by import path (a "
                                             "scorer function), besides the public names "
                                             "of --import modules (repeat)."),
    api_wait: float = typer.Option(30.0, "--api-wait", metavar="S",
                                   help="Fail when the Prefect API does not answer within "
                                        "this many seconds."),
) -> None:
    """Serve the scoring filter stages (Verify, ...) of any run that names POOL with
    --score-pool (generation runs on a fleet: gfcr engine serve). Needs PREFECT_API_URL
    (a real Prefect server), the run root's filesystem (staged tables) and Prefect result
    storage shared with the runs, and the pool's key: it runs only calls signed with it."""
    from gfcr.transport.remote.call import check_pool
    from gfcr.transport.remote.serve import serve_pool

    try:
        check_pool(pool)
        serve_pool(pool, name=name, timeout=timeout, imports=tuple(import_),
                   key_file=key_file, allow_refs=tuple(allow_ref), api_wait_s=api_wait)
    except (ValueError, RuntimeError, ImportError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2)


engine_app = typer.Typer(no_args_is_help=True,
                         help="A fleet's inference servers (runs name them with a fleet).")


@engine_app.command("serve", context_settings={"allow_extra_args": True,
                                               "ignore_unknown_options": True})
def engine_serve(
    ctx: typer.Context,
    model: str = typer.Option(..., "--model", metavar="DIR",
                              help="The model folder (config.json and safetensors)."),
    port: int = typer.Option(8000, "--port"),
    host: str = typer.Option("127.0.0.1", "--host", help="0.0.0.0 to serve other hosts "
                                                       "(needs --key-file)."),
    dtype: str = typer.Option("float32", "--dtype", help="The engine's dtype (the "
                                                         "pipeline's engine.dtype)."),
    seed: int = typer.Option(0, "--seed"),
    max_model_len: Optional[int] = typer.Option(None, "--max-model-len"),
    key_file: Optional[str] = typer.Option(None, "--key-file", metavar="PATH",
                                           help="The fleet's key (owner-only file; runs "
                                                "send it); default: the file "
                                                "GFCR_FLEET_KEY_FILE names."),
    weights_root: Optional[str] = typer.Option(None, "--weights-root", metavar="DIR",
                                               help="Load weights only from published "
                                                    "versions under DIR (default "
                                                    ".gfcr/weights)."),
) -> None:
    """Run vLLM's own OpenAI-compatible server with what a gfcr fleet needs (token ids
    in and out, gfcr's logprob convention, weights loaded by version, every route but
    /health behind the fleet's key; gfcr.transport.fleet_serve). Options after the known
    ones go to vLLM as they are (e.g. --kv-cache-memory-bytes)."""
    from gfcr.transport.fleet_serve import exec_server

    try:
        exec_server(model, port=port, host=host, dtype=dtype, seed=seed,
                    max_model_len=max_model_len, extra=tuple(ctx.args), key_file=key_file,
                    weights_root=weights_root)
    except ValueError as e:  # NoKey, KeyProblem: refused before vLLM starts
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2)
