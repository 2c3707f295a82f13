"""gfcr doctor: each check finds the pathology of a run built to show it, and a healthy
run (the default's stage chain on a learnable task) gets no serious finding.

Real short runs for what a CPU run shows in seconds; synthetic rows through the store's
real commit path for off-policy data, scorer timeouts and reward vs held-out accuracy
(tests/resources/runs.py says why)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from gfcr.cli import app
from gfcr.doctor import diagnose, serious
from store import RolloutStore
from tests.resources.runs import PATHOLOGIES, healthy_pipeline, pathology_pipeline, run, synthetic_run


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One store holding the healthy run and each pathology run."""
    root = tmp_path_factory.mktemp("doctor")
    run(healthy_pipeline(), root)
    for name, kw in PATHOLOGIES.items():
        run(pathology_pipeline(name, **kw), root)
    return root


def _findings(root: Path, run_id: str) -> dict[str, Any]:
    with RolloutStore.open(root / "store", read_only=True) as s:
        return {f.check: f for f in diagnose(s, run_id)}


def test_healthy_run_gets_no_serious_finding(runs: Path) -> None:
    found = _findings(runs, "healthy")
    assert not [f for f in found.values() if f.severity == "serious"], found
    result = CliRunner().invoke(app, ["doctor", "healthy", "--root", str(runs)])
    assert result.exit_code == 0, result.output


def test_too_large_lr_moves_the_policy_too_far(runs: Path) -> None:
    found = _findings(runs, "too_large_lr")
    step = found["policy_step"]
    assert step.severity == "serious" and step.figures["nll_jump"] >= 0.5
    assert step.steps[1] == step.steps[0] + 1 and "lower lr" in step.advice
    assert "entropy_collapse" in found  # the same jump collapses the sampling entropy
    result = CliRunner().invoke(app, ["doctor", "too_large_lr", "--root", str(runs), "--json"])
    assert result.exit_code == 1  # a serious finding
    listed = json.loads(result.output)
    assert {"policy_step", "entropy_collapse"} <= {f["check"] for f in listed}
    assert all({"severity", "evidence", "threshold", "advice", "steps", "figures"} <= set(f) for f in listed)


def test_a_reward_paying_for_brevity(runs: Path) -> None:
    found = _findings(runs, "brevity")
    assert found["length_collapse"].severity == "serious"
    assert found["length_collapse"].figures["length_last"] < 0.3 * found["length_collapse"].figures["length_first"]
    credit = found["partial_credit"]  # the same (empty) completion paid on most prompts, never right
    assert credit.severity == "serious" and credit.figures["wrong_reward_mass"] == 1.0
    assert found["mode_collapse"].severity == "serious"


def test_a_failing_scorer_and_a_filter_that_drops_everything(runs: Path) -> None:
    found = _findings(runs, "flaky")
    assert found["score_errors"].severity == "serious" and "cannot parse" in found["score_errors"].evidence
    starving = found["signal_starvation"]
    assert starving.severity == "serious" and starving.figures["kept_share"] == 0.0
    assert found["never_solved"].figures["never_solved_share"] == 1.0


def test_off_policy_truncated_is_timeouts_and_an_unsampled_training_set(tmp_path: Path) -> None:
    """Synthetic rows (the commit path): half of each batch replayed 12 versions stale,
    the learner's truncated-IS share at 40%, 8 of 32 rows a step timed out in the scorer,
    4 of the task's 64 prompts ever drawn."""
    with RolloutStore.open(tmp_path / "store") as s:
        synthetic_run(s, "stale", [{"train/offpolicy_share": 0.95, "train/is_truncated_share": 0.4}] * 16,
                      stale=12, timeouts=8)
        found = {f.check: f for f in diagnose(s, "stale")}
    assert found["off_policy"].severity == "serious" and found["off_policy"].figures["staleness_max"] == 12
    assert found["truncated_is"].severity == "serious"
    assert found["score_timeouts"].severity == "serious" and found["score_timeouts"].figures["share"] == 0.25
    assert found["never_sampled"].severity == "warning" and found["never_sampled"].figures["never_sampled_share"] > 0.9


def test_reward_rising_while_heldout_accuracy_falls(tmp_path: Path) -> None:
    """Synthetic rows whose pass rate climbs 0.1 -> 0.9 while the held-out accuracy
    recorded through the store (``record_evaluation``) falls; a run whose accuracy follows
    its reward is not flagged."""
    climb = [0.1 + 0.08 * i for i in range(11)]
    with RolloutStore.open(tmp_path / "store") as s:
        synthetic_run(s, "hacked", [{"reward_mean": r} for r in climb])
        synthetic_run(s, "honest", [{"reward_mean": r} for r in climb], seed=1)
        for i, r in enumerate(climb):
            for run_id, accuracy in (("hacked", 0.4 - 0.02 * i), ("honest", r)):
                s.record_evaluation(run_id, i, f"step={i}", accuracy=accuracy, n_prompts=64,
                                    temperature=0.0, max_tokens=8)
        hacked = {f.check: f for f in diagnose(s, "hacked")}
        honest = {f.check: f for f in diagnose(s, "honest")}
    assert hacked["reward_vs_heldout"].severity == "serious"
    assert hacked["reward_vs_heldout"].figures["heldout_gain"] < 0
    assert "reward_vs_heldout" not in honest


def test_bad_input_is_named(runs: Path, tmp_path: Path) -> None:
    cli = CliRunner()
    unknown = cli.invoke(app, ["doctor", "nope", "--root", str(runs)])
    assert unknown.exit_code == 2 and "no run 'nope'" in unknown.output
    missing = cli.invoke(app, ["doctor", "healthy", "--root", str(tmp_path / "none")])
    assert missing.exit_code == 2 and "no store" in missing.output
    assert serious([]) is False
