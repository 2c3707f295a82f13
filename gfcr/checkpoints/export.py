"""A run's policy at a checkpoint as a folder other tools load (``gfcr export``, and
``gfcr run --export DIR`` at the end of a run).

The run's stored pipeline rebuilds its policy (the same component, the run's seed), the
checkpoint's weights go into it, and the policy component writes the folder
(gfcr.core.capabilities.ExportsModel; stages.engines.export: safetensors weights, config,
generation config, tokenizer and chat template). A LoRA checkpoint holds the adapter
alone, trained over the policy after its warm start: the warm start is run again from its
cache (as a resume does) before the adapter is applied, then merged or kept as peft's
adapter.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gfcr.core.capabilities import ExportsModel
from gfcr.core.storage import RunStore
from gfcr.checkpoints import checkpoint
from gfcr.checkpoints.resume import stored_pipeline


class ExportError(ValueError):
    """A run cannot be exported: names the run, the step or the policy."""


def export_run(store: RunStore, root: Path, run_id: str, out: Path, *, step: int | None = None,
               lora: str = "merged") -> tuple[int, list[str]]:
    """Write run ``run_id``'s policy after ``step`` (None: its newest checkpoint) to
    ``out``; returns the step and the files written."""
    pipeline = stored_pipeline(store, run_id)
    found = checkpoint.complete(checkpoint.directory(Path(root), run_id))
    if not found:
        raise ExportError(f"run {run_id!r} has no complete checkpoint under "
                          f"{str(checkpoint.directory(Path(root), run_id))!r} to export")
    chosen = found[-1] if step is None else next((c for c in found if c.step == step), None)
    if chosen is None:
        raise ExportError(f"run {run_id!r} has no checkpoint of step {step!r}; it has steps "
                          f"{[c.step for c in found]!r} (checkpoint.keep keeps the newest)")
    component = pipeline.policy
    if not isinstance(component, ExportsModel):
        raise ExportError(f"policy {type(component).__name__!r} of run {run_id!r} cannot be "
                          "exported (it has no export method: gfcr.core.capabilities."
                          "ExportsModel)")
    if Path(out).exists() and any(Path(out).iterdir()):
        raise ExportError(f"{str(out)!r} exists and is not empty; export into a new folder")
    policy = component.build(seed=pipeline.seed)

    def base(built: Any) -> None:
        if pipeline.warmstart is not None:
            pipeline.warmstart.run(built, pipeline.task, seed=pipeline.seed,
                                   cache_dir=Path(root) / "cache", progress=None)

    files = component.export(policy, chosen.path / checkpoint.WEIGHTS, Path(out), lora=lora,
                             base=base)
    return chosen.step, files


class ExportHook:
    """Exports a run's final policy when it finishes (``gfcr run --export DIR``)."""

    def __init__(self, out: Path, *, lora: str = "merged") -> None:
        self.out, self.lora = Path(out), lora
        self._where: tuple[Any, Path, str] | None = None

    def on_start(self, *, run_id: str, root: Path, store: Any = None, **_: object) -> None:
        self._where = (store, Path(root), run_id)

    def on_end(self, *, summary: object, status: str, **_: object) -> None:
        if status != "finished" or self._where is None:
            return
        store, root, run_id = self._where
        export_run(store, root, run_id, self.out, lora=self.lora)
