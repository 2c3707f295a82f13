"""gfcr doctor's agentic checks over stored multi-turn episodes (a real DuckLake store):
tool-error loops, turn-limit truncation, format failures, episodes with no policy tokens;
a healthy agent run and a single-turn run get none of them."""

from __future__ import annotations

import pyarrow as pa

from gfcr.doctor import diagnose
from store import RolloutStore
from tests.resources.agentic import PROMPT, committed_run, episodes, turn
from tests.resources.runs import synthetic_run

AGENTIC = {"tool_error_loops", "turn_limit", "format_failures", "no_policy_tokens"}


def _call(error=None, name="python"):
    return [turn("policy", [20, 21]), turn("tool", [30], tool_name=name, tool_error=error)]


def _episode(*calls, answer=True):
    turns = [turn("environment", PROMPT)] + [t for c in calls for t in c]
    return turns + ([turn("policy", [40])] if answer else [])


def _step(trajectories, ends):
    return episodes(trajectories, episode_end=pa.array(ends, pa.string()))


def test_each_agentic_pathology_is_found_with_its_figures(tmp_path):
    """Per step, 6 episodes: 2 of the 4 with tool calls repeat one error (50%), 1 call does
    not parse (1/6), 4 hit the turn cap (2/3), 1 failed at reset (no policy token, 1/6)."""
    div = "ZeroDivisionError: division by zero"
    step = [_episode(_call(div), _call(div), answer=False),
            _episode(_call(div), _call("NameError: x"), _call(div), answer=False),
            _episode(_call(), _call("FormatError: could not parse the tool call"), answer=False),
            _episode(_call(), answer=False),
            _episode(), [turn("environment", PROMPT)]]
    ends = ["turn_limit"] * 4 + ["done", "env_error"]
    with RolloutStore.open(tmp_path / "store") as s:
        committed_run(s, "agent", [_step(step, ends), _step(step, ends)])
        found = {f.check: f for f in diagnose(s, "agent")}
    loops = found["tool_error_loops"]
    assert loops.severity == "serious" and loops.figures["loop_share"] == 0.5
    assert "ZeroDivisionError" in loops.evidence and loops.steps == (0, 1)
    limit = found["turn_limit"]
    assert limit.severity == "serious" and abs(limit.figures["turn_limit_share"] - 2 / 3) < 1e-9
    fmt = found["format_failures"]
    assert fmt.severity == "warning" and abs(fmt.figures["format_failure_share"] - 1 / 6) < 1e-9
    empty = found["no_policy_tokens"]
    assert empty.severity == "serious" and abs(empty.figures["no_policy_token_share"] - 1 / 6) < 1e-9


def test_a_healthy_agent_and_a_single_turn_run_get_no_agentic_finding(tmp_path):
    healthy = [_episode(_call()), _episode(_call(), _call("ValueError: bad input")), _episode()]
    with RolloutStore.open(tmp_path / "store") as s:
        committed_run(s, "fine", [_step(healthy, ["done"] * 3)])
        synthetic_run(s, "single", [{}] * 2)
        fine = {f.check for f in diagnose(s, "fine")}
        single = {f.check for f in diagnose(s, "single")}
    assert not fine & AGENTIC and not single & AGENTIC
