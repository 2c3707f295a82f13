"""MLflow tracking: one run per pipeline run on a SQLite backend, spec as params."""

from __future__ import annotations

from mlflow.tracking import MlflowClient

from gfcr.launch.run import execute
from gfcr.tracking.mlflow_hook import MlflowHook, flatten
from tests.conftest import tiny_pipeline


def test_flatten_keys_stages_by_name():
    flat = flatten({"a": {"b": 1}, "stages": [{"type": "verify"}, {"type": "g", "name": "x",
                                                                    "n": 2}]})
    assert flat == {"a.b": "1", "stages.verify.type": "verify", "stages.x.type": "g",
                    "stages.x.name": "x", "stages.x.n": "2"}


def test_run_is_tracked(tmp_path):
    pipeline = tiny_pipeline()
    summary = execute(pipeline, root=tmp_path, executor="local", hooks=[MlflowHook()])
    assert summary.mlflow == f"sqlite:///{(tmp_path / 'mlflow.db').resolve()}"
    client = MlflowClient(tracking_uri=summary.mlflow)
    (run,) = client.search_runs([client.get_experiment_by_name("tiny").experiment_id])
    assert run.info.run_name == summary.run_id and run.info.status == "FINISHED"
    assert run.data.params["stages.grpo.lr"] == "0.001"
    assert run.data.params["task.type"] == "reasoning_gym"
    assert run.data.tags["gfcr.spec_hash"] == pipeline.spec_hash()
    history = client.get_metric_history(run.info.run_id, "reward_mean")
    assert [m.step for m in history] == [0, 1]
    accuracy = client.get_metric_history(run.info.run_id, "heldout_accuracy")
    assert [m.step for m in accuracy] == [0, 2]
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"pipeline.yaml", "summary.json"} <= artifacts
    assert (tmp_path / "mlartifacts").is_dir()
