"""MLflow tracking as a run hook; the only module that imports mlflow.

One MLflow run per pipeline run, in an experiment named after the pipeline, with a SQLite
backend under the run root by default (the file store is deprecated) and artifacts in
``mlartifacts/`` beside it. Params are the
flattened spec, tags hold the spec hash, run id and store location, metrics are logged per
step, and the pipeline YAML and the summary are artifacts. Only the orchestrating process
logs. A resumed pipeline run continues its MLflow run (found by the ``gfcr.run_id`` tag)
rather than starting another; steps it replays are not logged again.

A step's metrics are one batch, written by MLflow's asynchronous logging (a background
thread) while the next step runs: writing ~40 metrics to SQLite took 10-30 ms of the
loop's thread per step. The hook waits for a step's batch before handing over the next
one and before the run ends, so a logging error surfaces at most one step late and
nothing is left unwritten.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

from gfcr.pipeline import Pipeline


def default_uri(root: Path) -> str:
    return f"sqlite:///{(Path(root) / 'mlflow.db').resolve()}"


def flatten(data: Any, prefix: str = "") -> dict[str, str]:
    """Nested spec -> {"stages.2.lr": "0.001", ...}; stages are keyed by their name."""
    if isinstance(data, dict):
        items = data.items()
    elif isinstance(data, list):
        items = ((_item_key(i, v), v) for i, v in enumerate(data))
    else:
        return {prefix: str(data)}
    out: dict[str, str] = {}
    for key, value in items:
        out.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def _item_key(index: int, value: Any) -> str:
    if isinstance(value, dict):
        return str(value.get("name") or value.get("type") or index)
    return str(index)


class MlflowHook:
    """Logs a pipeline run to MLflow; see the module docstring for what goes where."""

    def __init__(self, uri: str | None = None) -> None:
        self.uri = uri
        self._run: Any = None
        self._pending: Any = None  # the last step's batch, being written

    def on_start(self, *, run_id: str, pipeline: Pipeline, root: Path, resumed: bool = False,
                 **_: Any) -> None:
        import mlflow

        logging.getLogger("mlflow").setLevel(logging.WARNING)  # no table-creation chatter
        self.uri = self.uri or default_uri(root)
        mlflow.set_tracking_uri(self.uri)
        experiment = mlflow.get_experiment_by_name(pipeline.name)
        if experiment is None:  # artifacts beside the database, not in ./mlruns
            artifacts = (Path(root) / "mlartifacts").resolve().as_uri()
            mlflow.create_experiment(pipeline.name, artifact_location=artifacts)
        mlflow.set_experiment(pipeline.name)
        earlier = _find_run(pipeline.name, run_id) if resumed else None
        if earlier is not None:  # params are immutable in MLflow: keep the first ones
            self._run = mlflow.start_run(run_id=earlier)
            mlflow.set_tag("gfcr.resumed", "true")
            mlflow.log_text(pipeline.to_yaml(), "pipeline.yaml")
            return
        self._run = mlflow.start_run(run_name=run_id)
        params = flatten(pipeline.to_dict())
        items = list(params.items())
        for i in range(0, len(items), 100):  # MLflow caps a batch at 100 params
            mlflow.log_params(dict(items[i:i + 100]))
        mlflow.set_tags({"gfcr.run_id": run_id, "gfcr.spec_hash": pipeline.spec_hash(),
                         "gfcr.store": str((Path(root) / "store").resolve())})
        mlflow.log_text(pipeline.to_yaml(), "pipeline.yaml")

    def on_resume(self, *, step: int, **_: Any) -> None:
        import mlflow

        mlflow.log_metric("resumed_from_step", step, step=step + 1)

    def on_step(self, *, step: int, metrics: dict[str, float], replayed: bool = False,
                **_: Any) -> None:
        import mlflow

        if replayed:  # logged when the step first ran
            return

        finite = {_key(k): v for k, v in metrics.items() if math.isfinite(v)}
        self._wait()
        self._pending = mlflow.log_metrics(finite, step=step, synchronous=False)

    def on_eval(self, *, step: int, accuracy: float, label: str = "", **_: Any) -> None:
        import mlflow

        name = "heldout_accuracy_initial" if label == "initial" else "heldout_accuracy"
        mlflow.log_metric(name, accuracy, step=step)

    def on_end(self, *, summary: Any, status: str, **_: Any) -> None:
        import mlflow

        if self._run is None:
            return
        try:
            self._wait()
            if summary is not None:
                summary.mlflow = self.uri
                mlflow.log_text(json.dumps(summary.as_dict(), indent=2, default=str),
                                "summary.json")
        finally:
            mlflow.end_run(status="FINISHED" if status == "finished" else "FAILED")
            self._run = None

    def _wait(self) -> None:
        """Wait for the step batch being written; raises what writing it raised."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.wait()


def _find_run(experiment: str, run_id: str) -> str | None:
    """The MLflow run id of the pipeline run ``run_id`` (its ``gfcr.run_id`` tag), if any."""
    import mlflow

    runs = mlflow.search_runs(experiment_names=[experiment], output_format="list",
                              filter_string=f"tags.`gfcr.run_id` = '{run_id}'")
    return runs[0].info.run_id if runs else None


def _key(name: str) -> str:
    """MLflow metric names allow letters, digits and _-./ and spaces only."""
    return "".join(c if c.isalnum() or c in "_-./ " else "_" for c in name)
