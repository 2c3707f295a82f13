"""The ``turns`` view over stored multi-turn rows (a real DuckLake store): one row per turn
with its role, source, token and loss-token counts, tool, error, reward and logprob sum."""

from store import RolloutStore
from tests.resources.agentic import PROMPT, committed_run, episodes, turn


def test_the_turns_view_shows_each_turn_of_a_multi_turn_rollout(tmp_path):
    trajectory = [turn("environment", PROMPT), turn("policy", [5, 6, 7], logprob=-0.25),
                  turn("tool", [8, 9], tool_name="python", tool_error="ZeroDivisionError"),
                  turn("policy", [10, 11], reward=1.0, mask=[True, False], logprob=-1.0)]
    with RolloutStore.open(tmp_path / "store") as s:
        committed_run(s, "agent", [episodes([trajectory])])
        rows = s.sql("SELECT turn, role, source, n_tokens, n_loss_tokens, tool_name, "
                     "tool_error, reward, logprob_sum FROM turns WHERE run_id = 'agent' "
                     "ORDER BY turn").to_pylist()
    assert [tuple(r.values()) for r in rows] == [
        (0, "user", "environment", 2, 0, None, None, None, None),
        (1, "assistant", "policy", 3, 3, None, None, None, -0.75),
        (2, "tool", "tool", 2, 0, "python", "ZeroDivisionError", None, None),
        (3, "assistant", "policy", 2, 1, None, None, 1.0, -2.0)]
