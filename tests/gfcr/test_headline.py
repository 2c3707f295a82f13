"""The headline of ``gfcr report`` and the summary of ``gfcr run``: each phase credited its
own share of held-out accuracy, the sampled reward smoothed at both ends, multi-turn runs
told in policy tokens per turn, turns per episode and success by turns (a real store);
library warnings sent to a log file instead of the terminal."""

from __future__ import annotations

import warnings
from pathlib import Path

from gfcr.commands.summary import accuracy_rows
from gfcr.commands.warnings_log import warnings_to_log
from gfcr.report import load_runs
from gfcr.report.headline import ends, headline, shares
from store import RolloutStore
from tests.resources.agentic import PROMPT, committed_run, episodes, turn


def test_each_phase_is_credited_its_own_share() -> None:
    got = shares([(0, 0.0, "initial"), (0, 0.869, "step=0"), (30, 0.916, "step=30")])
    assert got["held-out accuracy"] == "0.0% → 91.6%"
    assert got["warm start's share"] == "0.0% → 86.9% (+86.9 points)"
    assert got["GRPO's share (after the warm start)"] == "86.9% → 91.6% (+4.7 points)"
    assert shares([(0, 0.5, "step=0"), (4, 0.25, "step=4")]) == {
        "held-out accuracy": "50.0% → 25.0%", "GRPO's share": "50.0% → 25.0% (-25.0 points)"}
    assert accuracy_rows(0.0, 0.869, 0.916)[2] == ("  GRPO's share", "86.9% -> 91.6% (+4.7 points)")
    assert accuracy_rows(0.1, None, 0.2) == [("held-out accuracy", "10.0% -> 20.0% (+10.0 points)")]
    assert [ends(n) for n in (1, 4, 10, 30, 500)] == [1, 1, 2, 6, 10]


def test_a_multi_turn_run_gets_turn_figures_not_a_length(tmp_path: Path) -> None:
    def episode(calls: int) -> list[dict]:
        mid = [t for _ in range(calls) for t in (turn("policy", [5, 6, 7]), turn("tool", [8] * 9, tool_name="py"))]
        return [turn("environment", PROMPT), *mid, turn("policy", [9])]
    rows = episodes([episode(0), episode(1), episode(1), episode(2)], rewards=[0.0, 1.0, 0.0, 1.0])
    with RolloutStore.open(tmp_path / "store") as s:
        committed_run(s, "agent", [rows, rows])
        (run,) = load_runs(s, ["agent"], samples=False)
    head = headline(run)
    assert "completion length (mean, last step)" not in head  # it counts the tools' text
    assert head["policy turns per episode (mean)"] == "2.00"  # (1 + 2 + 2 + 3) / 4
    assert head["policy tokens per turn (mean)"] == f"{(1 + 4 + 4 + 7) / 8:.1f}"
    assert head["success by policy turns"] == "1: 0.0% of 2, 2: 50.0% of 4, 3: 100.0% of 2"
    assert head["sampled reward (mean of first → last 1 step)"] == "0.500 → 0.500"


def test_library_warnings_go_to_the_log_not_the_terminal(tmp_path: Path, capsys) -> None:
    log = tmp_path / "runs" / "r" / "warnings.log"
    with warnings_to_log(log) as warned:
        for i in range(3):
            warnings.warn(f"`foo` is deprecated {i}", FutureWarning, stacklevel=1)
    assert warned.count == 3 and "3 library warning(s)" in (warned.note() or "")
    assert "`foo` is deprecated 2" in log.read_text()
    assert "deprecated" not in capsys.readouterr().err
    with warnings_to_log(tmp_path / "quiet.log") as quiet:
        pass
    assert quiet.note() is None and not (tmp_path / "quiet.log").exists()
