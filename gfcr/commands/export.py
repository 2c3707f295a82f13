"""``gfcr export RUN [--step N] --out DIR``: a run's policy as a folder that
``transformers.AutoModelForCausalLM.from_pretrained`` loads (gfcr.checkpoints.export)."""

from __future__ import annotations

from pathlib import Path
from typing import NoReturn, Optional

import typer
from rich.console import Console

err = Console(stderr=True)

LORA_HELP = ("A LoRA run's adapter: 'merged' into the weights (a plain model), or kept as "
             "peft's 'adapter' (DIR/adapter) beside the base model.")


def _fail(message: str) -> NoReturn:
    err.print(f"[red]error:[/red] {message}", markup=True, highlight=False)
    raise typer.Exit(2)


def export(
    run_id: str = typer.Argument(..., metavar="RUN", help="The run to export."),
    out: Path = typer.Option(..., "--out", help="New folder to write (safetensors weights, "
                                                "config, tokenizer, generation config)."),
    step: Optional[int] = typer.Option(None, help="The checkpoint's step (default: the "
                                                  "newest)."),
    lora: str = typer.Option("merged", help=LORA_HELP),
    root: Path = typer.Option(Path(".gfcr"), help="Run root (its checkpoints and caches)."),
    store: Optional[str] = typer.Option(None, help="Store folder or URI (default ROOT/store)."),
) -> None:
    """Write RUN's policy after a checkpointed step as a transformers folder."""
    from gfcr.core.storage import backend
    from gfcr.checkpoints.checkpoint import CheckpointError
    from gfcr.checkpoints.export import ExportError, export_run
    from gfcr.checkpoints.resume import ResumeError

    if lora not in ("merged", "adapter"):
        _fail(f"--lora must be 'merged' or 'adapter', got {lora!r}")
    try:
        with backend().open(store or root / "store", read_only=True, create=False) as s:
            done, files = export_run(s, root, run_id, out, step=step, lora=lora)
    except (ExportError, ResumeError, CheckpointError) + backend().errors as e:
        _fail(str(e))
    err.print(f"exported run {run_id!r} after step {done} to {out} ({len(files)} files)")
