"""Weights & Biases and TensorBoard as run hooks, beside MLflow (gfcr.tracking.mlflow_hook), and
:func:`trackers` that builds the ones a run names (``gfcr run --tracker ...``).

Each gets what MLflow gets: the per-step metrics (replayed steps of a resumed run are not
logged again), the evaluations under the names of :func:`gfcr.tracking.mlflow_hook.eval_metrics`,
the pipeline spec (W&B: the run's config, flattened as MLflow's params, and
``pipeline.yaml`` saved with the run; TensorBoard: the YAML as the text ``pipeline``) and
the summary at the end. Both are optional extras (``pip install 'gfcr[wandb]'``,
``'gfcr[tensorboard]'``): naming one that is not installed fails before the run starts,
saying what to install.

W&B logs to its server, or offline into ``ROOT/wandb`` with ``WANDB_MODE=offline``
(``wandb sync`` uploads it later); its project is the pipeline's name and its run id the
gfcr run id, so a resumed run continues its W&B run. TensorBoard writes event files under
``ROOT/tensorboard/<run_id>`` (``tensorboard --logdir ROOT/tensorboard``).
"""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path
from typing import Any

from gfcr.core.pipeline import Pipeline
from gfcr.tracking.mlflow_hook import MlflowHook, Summary, eval_metrics, flatten

TRACKERS = ("mlflow", "wandb", "tensorboard")
"""The trackers ``--tracker`` may name."""

_NEEDS = {"wandb": ("wandb", "wandb"), "tensorboard": ("tensorboard", "tensorboard")}
"""tracker -> (module it imports, the gfcr extra that installs it)."""


def trackers(names: tuple[str, ...], *, mlflow_uri: str | None = None
             ) -> list[object]:
    """The hooks of ``names`` (each once, in the order given); ValueError naming a
    tracker that is unknown or whose package is not installed."""
    hooks: list[object] = []
    for name in dict.fromkeys(names):
        if name not in TRACKERS:
            raise ValueError(f"tracker {name!r} is not one of {', '.join(TRACKERS)}")
        module, extra = _NEEDS.get(name, (None, None))
        if module is not None and importlib.util.find_spec(module) is None:
            raise ValueError(f"tracker {name!r} needs the {module!r} package: "
                             f"pip install 'gfcr[{extra}]'")
        hooks.append(MlflowHook(mlflow_uri) if name == "mlflow" else
                     WandbHook() if name == "wandb" else TensorBoardHook())
    return hooks


def _finite(metrics: dict[str, float]) -> dict[str, float]:
    return {k: float(v) for k, v in metrics.items() if v is not None and math.isfinite(v)}


class WandbHook:
    """Logs a pipeline run to Weights & Biases (see the module docstring)."""

    def __init__(self) -> None:
        self._run: Any = None

    def on_start(self, *, run_id: str, pipeline: Pipeline, root: Path, **_: object) -> None:
        import wandb

        folder = Path(root) / "wandb"
        folder.mkdir(parents=True, exist_ok=True)
        self._run = wandb.init(project=pipeline.name, id=run_id, name=run_id, dir=str(folder),
                               resume="allow", config=flatten(pipeline.to_dict()),
                               tags=[f"spec_hash:{pipeline.spec_hash()}"])
        # W&B's own step only increases (an evaluation after step N comes after its
        # metrics, a resumed run again from its checkpoint): rows are plotted against ours
        self._run.define_metric("step")
        self._run.define_metric("*", step_metric="step")
        spec = folder / f"{run_id}-pipeline.yaml"
        spec.write_text(pipeline.to_yaml())
        self._run.save(str(spec), base_path=str(folder), policy="now")

    def on_step(self, *, step: int, metrics: dict[str, float], replayed: bool = False,
                **_: object) -> None:
        if self._run is not None and not replayed:
            self._run.log({**_finite(metrics), "step": step})

    def on_eval(self, *, step: int, accuracy: float, label: str = "",
                eval_set: str = "heldout", metrics: dict[str, float] | None = None,
                **_: object) -> None:
        if self._run is not None:
            figures = _finite(eval_metrics(accuracy, label, eval_set, metrics))
            self._run.log({**figures, "step": step})

    def on_end(self, *, summary: Summary | None, status: str, **_: object) -> None:
        if self._run is None:
            return
        if summary is not None:
            self._run.summary.update({"gfcr/" + k: v for k, v in summary.as_dict().items()
                                      if isinstance(v, (int, float, str))})
        self._run.finish(exit_code=0 if status == "finished" else 1)
        self._run = None


class TensorBoardHook:
    """Writes a pipeline run's TensorBoard event files (see the module docstring)."""

    def __init__(self) -> None:
        self._writer: Any = None

    def on_start(self, *, run_id: str, pipeline: Pipeline, root: Path, **_: object) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self._writer = SummaryWriter(log_dir=str(Path(root) / "tensorboard" / run_id))
        self._writer.add_text("pipeline", _code(pipeline.to_yaml()))
        self._writer.add_text("spec_hash", pipeline.spec_hash())

    def on_step(self, *, step: int, metrics: dict[str, float], replayed: bool = False,
                **_: object) -> None:
        if self._writer is not None and not replayed:
            for name, value in _finite(metrics).items():
                self._writer.add_scalar(name, value, global_step=step)

    def on_eval(self, *, step: int, accuracy: float, label: str = "",
                eval_set: str = "heldout", metrics: dict[str, float] | None = None,
                **_: object) -> None:
        if self._writer is not None:
            for name, value in _finite(eval_metrics(accuracy, label, eval_set,
                                                    metrics)).items():
                self._writer.add_scalar(name, value, global_step=step)
            self._writer.flush()

    def on_end(self, *, summary: Summary | None, status: str, **_: object) -> None:
        if self._writer is None:
            return
        if summary is not None:
            self._writer.add_text("summary", _code(json.dumps(summary.as_dict(), indent=2,
                                                              default=str)))
        self._writer.add_text("status", status)
        self._writer.close()
        self._writer = None


def _code(text: str) -> str:
    """Text shown verbatim by TensorBoard's markdown renderer (indented four spaces)."""
    return "\n".join("    " + line for line in text.splitlines())
