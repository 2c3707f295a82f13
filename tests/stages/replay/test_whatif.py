"""What-if replay: re-filter and re-score a stored run without generating; the CLI."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from gfcr.cli import app
from stages import DynamicSampling, GroupSample, Verify
from stages.replay.whatif import what_if
from store import RolloutStore
from tests.conftest import tiny_pipeline
from tests.resources.replay import attempts

runner = CliRunner()


@pytest.fixture
def root(tmp_path):
    """A store with run "w": step 0 groups qa (1,0,1,0) and qb (0,0,0,0), step 1 qc (1,1,1,1),
    all kept (the run had no dynamic sampling). Completions equal the answer exactly where
    the reward is 1, and are "7 " (right digit, trailing space) in qc's last sample."""
    with RolloutStore.open(tmp_path / "store") as s:
        p = tiny_pipeline()
        s.start_run("w", pipeline="tiny", spec_yaml=p.to_yaml(), spec_hash=p.spec_hash(),
                    code_version="test")
        s0 = attempts(0, {"qa": [1.0, 0.0, 1.0, 0.0], "qb": [0.0] * 4}, run_id="w",
                      answer=["7"] * 8, completion=["7", "8", "7", "9", "1", "2", "3", "4"])
        s1 = attempts(1, {"qc": [1.0] * 4}, run_id="w", answer=["7"] * 4,
                      completion=["7", "7", "7", "7 "])
        s.commit_step("w", 0, s0, policy_version=0, metrics={})
        s.commit_step("w", 1, s1, policy_version=1, metrics={})
    return tmp_path


def test_dynamic_sampling_after_the_run_would_drop_the_flat_groups(root):
    with RolloutStore.open(root / "store", read_only=True) as s:
        report = what_if(s, "w", [DynamicSampling()])
    t = report.totals
    assert (t["rows"], t["kept_before"], t["kept_after"], t["newly_dropped"]) == (12, 12, 4, 8)
    assert (t["groups_before"], t["groups_after"], t["rewards_changed"]) == (3, 1, 0)
    assert report.reasons == {"dynamic_sampling: zero_variance": 8}
    assert [(e["step"], e["kept_after"]) for e in report.steps] == [(0, 4), (1, 0)]
    assert t["kept_reward_after"] == pytest.approx(0.5)


def test_rescoring_with_a_stricter_verifier_then_filtering(root):
    with RolloutStore.open(root / "store", read_only=True) as s:
        report = what_if(s, "w", [Verify(scorer="exact"), DynamicSampling()], base="all")
    t = report.totals
    # "exact" strips whitespace too: every reward is unchanged; qc stays flat
    assert t["rewards_changed"] == 0 and t["kept_after"] == 4
    with RolloutStore.open(root / "store", read_only=True) as s:
        strict = what_if(s, "w", [Verify(scorer="regex:^7$")], base="all")
    assert strict.totals["rewards_changed"] == 1  # "7 " no longer matches
    assert strict.totals["reward_after"] == pytest.approx(strict.totals["reward_before"] - 1 / 12)
    row = [r for r in strict.rows.to_pylist() if r["reward_before"] != r["reward_after"]]
    assert [r["rollout_id"] for r in row] == ["w/1/qc/3"]


def test_errors_name_what_is_wrong(root):
    with RolloutStore.open(root / "store", read_only=True) as s:
        with pytest.raises(ValueError, match="no run 'nope'"):
            what_if(s, "nope", [DynamicSampling()])
        with pytest.raises(ValueError, match="not a filter stage"):
            what_if(s, "w", [GroupSample()])
        with pytest.raises(ValueError, match="base must be"):
            what_if(s, "w", [DynamicSampling()], base="some")


def test_cli_what_if_json_and_table(root):
    result = runner.invoke(app, ["replay", "what-if", "w", "--filter", "type=dynamic_sampling",
                                 "--root", str(root), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["totals"]["kept_after"] == 4 and report["stages"] == ["dynamic_sampling"]
    table = runner.invoke(app, ["replay", "what-if", "w", "--filter", "{type: verify, scorer: exact}",
                                "--filter", "type=dynamic_sampling", "--base", "all", "--root", str(root)])
    assert table.exit_code == 0, table.output
    assert "12 -> 4" in table.stdout


@pytest.mark.parametrize("spec, message", [
    ("type=no_such_filter", "unknown filter type 'no_such_filter'"),
    ("type=dynamic_sampling,mode=sometimes", "field 'mode'"),
    ("scorer: exact", "must name a filter stage"),
])
def test_cli_what_if_bad_filter(root, spec, message):
    result = runner.invoke(app, ["replay", "what-if", "w", "--filter", spec, "--root", str(root)])
    assert result.exit_code == 2 and message in result.output.replace("\n", " ")
