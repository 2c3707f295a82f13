"""Per-step tool figures of multi-turn episodes (gfcr.runner.tool_metrics): the
tool-call rate over fresh episodes, the tool-error rate over calls (from the turns, or
an agent's own counts in its reward components), success; and how the report's
headline and charts show them."""

from __future__ import annotations

import math

import pyarrow as pa

from gfcr.core.rollout import EPISODE_END, col
from gfcr.report.data import RunData
from gfcr.report.headline import headline
from gfcr.report.page import CHARTS, OPTIONAL
from gfcr.runner.tool_metrics import tool_metrics
from tests.resources.agentic import PROMPT, episodes, turn


def _with_end(table: pa.Table) -> pa.Table:
    return table.append_column(EPISODE_END, pa.array(["done"] * table.num_rows, pa.string()))


def test_call_and_error_rates_count_fresh_episodes_and_their_calls() -> None:
    call = [turn("policy", [5, 6]), turn("tool", [7], tool_name="python")]
    failed = [turn("policy", [5, 6]), turn("tool", [7], tool_name="python", tool_error="parse: x")]
    rows = episodes([[turn("environment", PROMPT), *call, turn("policy", [9])],
                     [turn("environment", PROMPT), *failed, turn("policy", [9])],
                     [turn("environment", PROMPT), *call, *call, turn("policy", [9])],
                     [turn("environment", PROMPT), turn("policy", [9])]],
                    rewards=[1.0, 0.0, 1.0, 0.0])
    got = tool_metrics(_with_end(rows))
    assert got == {"tool/call_rate": 0.75, "tool/error_rate": 0.25, "tool/calls": 4.0,
                   "tool/success": 0.5}
    replayed = rows.set_column(rows.column_names.index(col.REPLAY_COUNT),
                               rows.schema.field(col.REPLAY_COUNT),
                               pa.array([0, 1, 1, 1], rows.schema.field(col.REPLAY_COUNT).type))
    assert tool_metrics(_with_end(replayed))["tool/call_rate"] == 1.0  # fresh rows only
    assert tool_metrics(rows) == {}  # a single-turn stage's step: no tool figures


def test_an_agents_own_counts_add_the_calls_the_turns_cannot_show() -> None:
    rows = episodes([[turn("environment", PROMPT), turn("policy", [5])]] * 2, rewards=[0.0, 1.0])
    said = pa.array([[("tool_calls", 1.0), ("tool_errors", 1.0)], None],
                    rows.schema.field(col.REWARDS).type)
    rows = rows.set_column(rows.column_names.index(col.REWARDS),
                           rows.schema.field(col.REWARDS), said)
    got = tool_metrics(_with_end(rows))
    assert (got["tool/call_rate"], got["tool/error_rate"], got["tool/calls"]) == (0.5, 1.0, 1.0)


def test_the_report_shows_tool_use_first_to_last_step() -> None:
    series = {"tool/call_rate": [0.25, math.nan, 0.75], "tool/error_rate": [0.5, 0.1, 0.0],
              "tool/success": [0.1, 0.2, 0.4]}
    run = RunData("r", {"status": "finished"}, [0, 1, 2], series)
    head = headline(run)
    assert head["tool-call rate (first → last step)"] == "25.0% → 75.0%"
    assert head["tool-error rate (first → last step)"] == "50.0% → 0.0%"
    assert head["episode success (first → last step)"] == "10.0% → 40.0%"
    assert "tool-call rate (first → last step)" not in headline(RunData("q", {"status": "x"}, [0]))
    charted = {name for _, name, _ in CHARTS}
    assert {"tool/call_rate", "tool/error_rate", "tool/success"} <= charted & OPTIONAL
