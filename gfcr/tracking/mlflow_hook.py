"""MLflow tracking as a run hook; the only module that imports mlflow.

One MLflow run per pipeline run, in an experiment named after the pipeline, with a SQLite
backend under the run root by default (the file store is deprecated) and artifacts in
``mlartifacts/`` beside it. Params are the flattened spec, tags hold the spec hash, run
id and store location, metrics are logged per step, and the pipeline YAML, the summary
and the report page (``report.html``) are artifacts. Only the orchestrating process logs.
A resumed pipeline run continues its MLflow run (found by the ``gfcr.run_id`` tag) rather
than starting another, and first logs the committed steps that MLflow run lacks, from the
store (each step's ``steps`` row holds its metrics); the steps it replays are not logged
again.

Step metrics are written in batches, at most one every ``flush_seconds`` (and at each
evaluation and the run's end), by MLflow's asynchronous logging (a background thread)
while the loop goes on. In a default run (a step is about a second) MLflow's writer
spent 10-15 ms of CPU a step on a batch a step, and 2-4 ms a step on batches of ten
(bench/engine.py, the runtime's CPU by thread). The hook waits for one batch before
handing over the next and before the run ends, so a logging error surfaces at most one
batch late. A killed process loses from MLflow at most the batch not yet written, which
the store still holds and a resume logs.
"""

from __future__ import annotations

import fcntl
import json
import logging
import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable, Mapping, Protocol

from gfcr.core.pipeline import Pipeline
from gfcr.core.storage import RunStore


def default_uri(root: Path) -> str:
    return f"sqlite:///{(Path(root) / 'mlflow.db').resolve()}"


@contextmanager
def first_use_lock(uri: str) -> Iterator[None]:
    """An exclusive file lock beside a SQLite MLflow database while the block runs.

    MLflow creates and migrates its schema on a process's first connection; two runs
    starting together on a fresh root both migrated, and one died in alembic
    (``CircularDependencyError``). Under this lock the first process sets the schema up
    (and creates the experiment) while the second waits, then finds both done. Other
    backends (a tracking server) serialise this themselves.
    """
    if not uri.startswith("sqlite:///"):
        yield
        return
    lock_path = Path(uri[len("sqlite:///"):]).with_suffix(".db.lock")
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


class Summary(Protocol):
    """What a tracker reads of a run's summary at its end (gfcr.launch.hooks.RunSummary)."""

    mlflow: str | None
    report: str | None

    def as_dict(self) -> Mapping[str, object]: ...


def flatten(data: object, prefix: str = "") -> dict[str, str]:
    """Nested spec -> {"stages.2.lr": "0.001", ...}; stages are keyed by their name."""
    items: Iterable[tuple[object, object]]
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


def eval_metrics(accuracy: float, label: str, eval_set: str,
                 metrics: dict[str, float] | None) -> dict[str, float]:
    """An evaluation's figures as every tracker names them: ``heldout_accuracy`` (or
    ``heldout_accuracy_initial`` before a warm start) as always, the held-out split's
    other figures as ``heldout_<name>`` (``heldout_mean_reward``, ``heldout_pass_at_4``) and
    an evaluation set's as ``eval/<set>/<name>``."""
    figures = dict(metrics or {"accuracy": accuracy})
    suffix = "_initial" if label == "initial" else ""
    if eval_set == "heldout":
        return {f"heldout_{name}{suffix}": value for name, value in figures.items()}
    return {f"eval/{eval_set}/{name}{suffix}": value for name, value in figures.items()}


def _item_key(index: int, value: object) -> str:
    if isinstance(value, dict):
        return str(value.get("name") or value.get("type") or index)
    return str(index)


class MlflowHook:
    """Logs a pipeline run to MLflow; see the module docstring for what goes where."""

    def __init__(self, uri: str | None = None, *, flush_seconds: float = 10.0) -> None:
        self.uri = uri
        self.flush_seconds = flush_seconds
        self._run: Any = None
        self._buffer: list[Any] = []  # step metrics not yet handed to MLflow
        self._flushed = time.monotonic()
        self._pending: list[Any] = []  # the last batch, being written

    def on_start(self, *, run_id: str, pipeline: Pipeline, root: Path, resumed: bool = False,
                 store: RunStore | None = None, **_: object) -> None:
        import mlflow

        logging.getLogger("mlflow").setLevel(logging.WARNING)  # no table-creation chatter
        self.uri = self.uri or default_uri(root)
        mlflow.set_tracking_uri(self.uri)
        with first_use_lock(self.uri):  # schema set-up and experiment, one process at a time
            experiment = mlflow.get_experiment_by_name(pipeline.name)
            if experiment is None and _local(self.uri):  # artifacts beside the database, not in ./mlruns
                artifacts = (Path(root) / "mlartifacts").resolve().as_uri()
                mlflow.create_experiment(pipeline.name, artifact_location=artifacts)
        mlflow.set_experiment(pipeline.name)
        earlier = _find_run(pipeline.name, run_id) if resumed else None
        if earlier is not None:  # params are immutable in MLflow: keep the first ones
            self._run = mlflow.start_run(run_id=earlier)
            mlflow.set_tag("gfcr.resumed", "true")
        else:
            self._run = mlflow.start_run(run_name=run_id)
            params = flatten(pipeline.to_dict())
            items = list(params.items())
            for i in range(0, len(items), 100):  # MLflow caps a batch at 100 params
                mlflow.log_params(dict(items[i:i + 100]))
            where = store.uri if store is not None else str((Path(root) / "store").resolve())
            mlflow.set_tags({"gfcr.run_id": run_id, "gfcr.spec_hash": pipeline.spec_hash(),
                             "gfcr.store": str(where)})
        mlflow.log_text(pipeline.to_yaml(), "pipeline.yaml")
        if resumed and store is not None:
            self._backfill(store, run_id)

    def on_resume(self, *, step: int, **_: object) -> None:
        import mlflow

        mlflow.log_metric("resumed_from_step", step, step=step + 1)

    def on_step(self, *, step: int, metrics: dict[str, float], replayed: bool = False,
                **_: object) -> None:
        from mlflow.entities import Metric

        if replayed:  # logged when the step first ran, or backfilled at the start
            return
        now = int(time.time() * 1000)
        self._buffer += [Metric(_key(k), v, now, step) for k, v in metrics.items()
                         if math.isfinite(v)]
        if time.monotonic() - self._flushed >= self.flush_seconds:
            self._flush()

    def on_eval(self, *, step: int, accuracy: float, label: str = "",
                eval_set: str = "heldout", metrics: dict[str, float] | None = None,
                **_: object) -> None:
        import mlflow

        self._flush()
        mlflow.log_metrics({_key(k): v for k, v in
                            eval_metrics(accuracy, label, eval_set, metrics).items()},
                           step=step)

    def on_end(self, *, summary: Summary | None, status: str, **_: object) -> None:
        import mlflow

        if self._run is None:
            return
        try:
            self._flush()
            self._wait()
            if summary is not None:
                summary.mlflow = self.uri
                mlflow.log_text(json.dumps(summary.as_dict(), indent=2, default=str),
                                "summary.json")
                if summary.report:  # the run's report page (gfcr.report.publish)
                    mlflow.log_artifact(summary.report)
        finally:
            mlflow.end_run(status=_END_STATUS.get(status, "FAILED"))
            self._run = None

    def _backfill(self, store: RunStore, run_id: str) -> None:
        """Log the committed steps of ``run_id`` after the last one MLflow has (a killed
        process's unwritten batch), from their ``steps`` rows."""
        from mlflow.entities import Metric

        from gfcr.core.storage import backend

        rows = backend().reads(store).steps(run_id, after=_last_step(self._run.info.run_id)).to_pylist()
        for row in rows:
            at = int(row["committed_at"].timestamp() * 1000)
            self._buffer += [Metric(_key(k), v, at, row["step"]) for k, v in row["metrics"]
                             if v is not None and math.isfinite(v)]
        self._flush()

    def _flush(self) -> None:
        """Hand the buffered step metrics to MLflow's background writer, once the batch
        before is written."""
        from mlflow.tracking import MlflowClient

        self._flushed = time.monotonic()
        if not self._buffer:
            return
        batch, self._buffer = self._buffer, []
        self._wait()
        client, run_id = MlflowClient(), self._run.info.run_id
        self._pending = [client.log_batch(run_id, metrics=batch[i:i + MAX_BATCH],
                                          synchronous=False)
                         for i in range(0, len(batch), MAX_BATCH)]

    def _wait(self) -> None:
        """Wait for the batch being written; raises what writing it raised."""
        pending, self._pending = self._pending, []
        for operation in pending:
            operation.wait()


_END_STATUS = {"finished": "FINISHED", "cancelled": "KILLED"}
"""MLflow's run status for a gfcr run's final status (anything else: FAILED)."""


def _local(uri: str) -> bool:
    """Whether ``uri`` is a database or folder this process writes itself (not a
    tracking server, which places artifacts where it was told to)."""
    return not uri.startswith(("http://", "https://", "databricks"))


MAX_BATCH = 1000
"""Most metrics MLflow takes in one log_batch call."""


def _last_step(mlflow_run_id: str) -> int:
    """The last step whose metrics the MLflow run holds (-1: none). Every step logs
    ``step_seconds``."""
    from mlflow.tracking import MlflowClient

    history = MlflowClient().get_metric_history(mlflow_run_id, "step_seconds")
    return max((m.step for m in history), default=-1)


def _find_run(experiment: str, run_id: str) -> str | None:
    """The MLflow run id of the pipeline run ``run_id`` (its ``gfcr.run_id`` tag), if any."""
    import mlflow

    runs = mlflow.search_runs(experiment_names=[experiment], output_format="list",
                              filter_string=f"tags.`gfcr.run_id` = '{run_id}'")
    return runs[0].info.run_id if runs else None


def _key(name: str) -> str:
    """MLflow metric names allow letters, digits and _-./ and spaces only."""
    return "".join(c if c.isalnum() or c in "_-./ " else "_" for c in name)
