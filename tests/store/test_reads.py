"""The store's named run reads (store.reads.LakeRunReads, gfcr.core.storage.RunReads): each read
and each per-run view on a small store whose figures are worked out by hand here."""

from __future__ import annotations

import pytest

from gfcr.core import storage
from store.reads import LakeRunReads
from store.run_views import RUN_VIEWS

from .conftest import commit_history, make_rollouts


@pytest.fixture
def reads(store):
    """Run "r" (conftest.commit_history, started first) and run "e" (failed): four rows
    of one step, each its own prompt, with partial credit and scorer errors."""
    store.start_run("r", pipeline="p", spec_yaml="steps: 2", spec_hash="h", code_version="v")
    commit_history(store)
    store.start_run("e", pipeline="p", spec_yaml="steps: 1", spec_hash="h", code_version="v")
    e = make_rollouts(4, run_id="e", step=0, group_size=1, rewards=[0.5, 0.5, 0.25, 0.0],
                      completion=["same", "same", "other", "x"],
                      score_error=[None, None, "Timeout after 'abc' s", "Wrong: '7' is not '8'"])
    store.commit_step("e", 0, e, policy_version=0, metrics={"heldout_accuracy": 0.25})
    store.finish_run("e", "failed", error="boom")
    return LakeRunReads(store)


def test_the_backend_serves_the_reads(store):
    assert isinstance(storage.backend().reads(store), LakeRunReads)


def test_runs_run_and_latest(reads):
    assert reads.run("r")["spec_yaml"] == "steps: 2" and reads.run("nope") is None
    runs = reads.runs().to_pylist()
    assert [(r["run_id"], r["status"], r["error"]) for r in runs] == [("r", "running", None),
                                                                       ("e", "failed", "boom")]
    assert reads.runs().column_names == ["run_id", "pipeline", "status", "started_at", "finished_at",
                                         "spec_hash", "error"]
    assert reads.latest_run_ids(1) == ["e"] and reads.latest_run_ids(5) == ["e", "r"]


def test_steps_columns_and_counts(reads):
    steps = reads.steps("r").to_pylist()
    assert [(s["step"], dict(s["metrics"])) for s in steps] == [(0, {"loss": 1.0}), (1, {"loss": 0.5, "kl": 0.01})]
    assert [s["step"] for s in reads.steps("r", after=0).to_pylist()] == [1]
    assert reads.steps("r", after=1).num_rows == 0
    assert {"reward", "prompt_id", "turns"} <= set(reads.rollout_columns())
    assert (reads.rollout_count("r"), reads.rollout_count("e"), reads.rollout_count("nope")) == (13, 4, 0)


def test_report_views(reads):
    steps = {r["step"]: r for r in reads.view("report_steps", "r").to_pylist()}
    assert (steps[0]["rows"], steps[0]["kept_share"], steps[1]["rows"]) == (8, 7 / 8, 5)
    assert steps[0]["sampled_reward"] == pytest.approx(3 / 7)  # row 6 unscored
    assert (steps[0]["replayed_share"], steps[1]["replayed_share"]) == (0.0, 1 / 5)
    assert reads.view("report_steps", "e").to_pylist()[0]["score_error_share"] == 1 / 4  # a verdict is no error
    assert reads.view("drops", "r").to_pylist() == [{"step": 0, "dropped_by": "length_filter",
                                                     "reason": "too long", "n": 1}]
    bins = sorted((r["step"], r["bin"], r["n"]) for r in reads.view("pass_bins", "r").to_pylist())
    assert bins == [(0, 0, 1), (0, 3, 1), (1, 2, 1), (1, 5, 1)]  # qB none, qA 3/4; qA 1/1, qB 1/2


def test_doctor_views(reads):
    groups = reads.view("group_facts", "r").to_pylist()
    assert [(g["step"], g["groups"], g["zero_variance"], g["identical"]) for g in groups] == [
        (0, 2, 0.5, 0.0), (1, 2, 0.5, 0.0)]
    partial = {r["step"]: r for r in reads.view("partial_credit", "e").to_pylist()}
    assert partial[0]["rewarded_wrong"] == 3 / 4 and partial[0]["wrong_reward_mass"] == 1.0
    wrong = reads.view("repeated_wrong", "e").to_pylist()
    assert [(w["completion"], w["prompts"], w["rows"]) for w in wrong] == [("same", 2, 2), ("other", 1, 1)]
    assert reads.view("score_errors", "e").to_pylist() == [
        {"error": "Timeout after '…' s", "n": 1, "first_step": 0, "last_step": 0}]
    assert reads.view("prompt_coverage", "r").to_pylist() == [
        {"sampled": 2, "attempted": 2, "never_solved": 0, "attempted_twice": 2, "draws": 4}]
    with pytest.raises(KeyError, match=r"no run view 'nope'; the store has \["):
        reads.view("nope", "r")  # type: ignore[arg-type]
    assert set(RUN_VIEWS) == set(storage.RunView.__args__)  # type: ignore[attr-defined]


def test_evaluations_from_the_table_else_the_step_metric(reads, store):
    assert reads.evaluations("e").to_pylist() == [{"step": 1, "accuracy": 0.25, "label": "step=1"}]
    assert reads.evaluations("r").num_rows == 0
    store.record_evaluation("e", 1, "final", accuracy=0.5, n_prompts=4, temperature=0.0, max_tokens=8)
    assert reads.evaluations("e").to_pylist() == [{"step": 1, "accuracy": 0.5, "label": "final"}]


def test_samples_one_row_of_each_kind_per_step(reads):
    rows = reads.samples("r", [0, 1]).to_pylist()
    assert [(r["step"], r["kind"]) for r in rows] == [
        (0, "dropped"), (0, "right"), (0, "unscored"), (0, "wrong"),
        (1, "right"), (1, "unscored"), (1, "wrong")]
    assert all(r["prompt"] in ("qA", "qB") for r in rows)
    assert [r["step"] for r in reads.samples("r", [1]).to_pylist()] == [1, 1, 1]
    assert reads.samples("nope", [0]).num_rows == 0
    assert {r["prompt"] for r in rows if r["kind"] == "dropped"} == {"qA"}
