"""The shipped environments: their rules, and whole episodes through the episodes stage
with a scripted policy (tool calls, tool errors, feedback, a game)."""

from __future__ import annotations

import json

import pytest

from gfcr.core.rollout import EPISODE_END, col
from stages.envs.feedback import Feedback
from stages.envs.guess import GuessNumber
from stages.envs.python_tool import INSTRUCTIONS
from stages.sandbox import unavailable
from stages.generate.episodes import Episodes
from tests.resources.rollouts import context
from tests.resources.sandbox_users import require
from tests.resources.scripted import ScriptedEngine
from tests.stages.generate.test_episodes import plan


def say(script: dict[str, dict[str, float]], before: str, reply: str) -> str:
    """Script the policy to reply ``reply`` (then EOS) after the text ``before``."""
    for i, c in enumerate(reply):
        script[before + reply[:i]] = {c: 1.0}
    script[before + reply] = {"<eos>": 1.0}
    return before + reply


def test_feedback_tells_wrong_answers_and_hints_then_stops_after_max_tries() -> None:
    env = Feedback(max_tries=3, hint="direction", decay=0.5, repeat=True)
    env.reset({"prompt": "4+7-2=", "answer": "9"})
    first = env.step("7")
    assert [m.content for m in first.messages] == ["wrong, try again. it is higher. 4+7-2="]
    assert first.reward == 0.0 and not first.done
    assert env.step("12").messages[0].content.startswith("wrong, try again. it is lower.")
    env.reset({"prompt": "4+7-2=", "answer": "9"})
    env.step("1")
    right = env.step("the answer is 9")
    assert right.done and right.reward == 0.5  # the second try: decay ** 1
    env.reset({"prompt": "1+1=", "answer": "2"})
    assert [env.step("3").done for _ in range(3)] == [False, False, True]
    answer = Feedback(hint="answer")
    answer.reset({"prompt": "1+1=", "answer": "2"})
    assert answer.step("5").messages[0].content == "wrong, try again. hint: 2."
    with pytest.raises(ValueError, match="max_tries"):
        Feedback(max_tries=0)


def test_guess_answers_higher_or_lower_from_its_state_until_found() -> None:
    env = GuessNumber(low=1, high=16, format_reward=-0.1)
    env.reset({"prompt": "p", "answer": "11"})
    assert env.secret == 11
    assert env.step("8").messages[0].content == "higher"
    assert env.step("12").messages[0].content == "lower"
    bad = env.step("eleven")
    assert bad.reward == -0.1 and "Reply with one number" in bad.messages[0].content
    assert env.step("11").done and env.guesses == [8, 12, 11]
    drawn = GuessNumber(low=1, high=16)
    drawn.reset({"prompt": "p", "answer": None, "prompt_id": "abc"})
    again = GuessNumber(low=1, high=16)
    again.reset({"prompt": "q", "answer": None, "prompt_id": "abc"})
    assert drawn.secret == again.secret and 1 <= drawn.secret <= 16


def _tool(code: str) -> str:
    return "<tool_call>" + json.dumps({"name": "python", "arguments": {"code": code}}) + \
        "</tool_call>"


def test_python_tool_episodes_store_the_tool_turns_with_their_errors() -> None:
    require(unavailable() is None, f"namespaces unavailable: {unavailable()}")
    script: dict[str, dict[str, float]] = {}
    tools = 'Tools: [{"description": "Run a Python program in a sandbox and see what it ' \
            'prints.", "name": "python", "parameters": {"properties": {"code": ' \
            '{"description": "The program.", "type": "string"}}, "required": ["code"], ' \
            '"type": "object"}}]'
    head = f"{tools}\n{INSTRUCTIONS}\n"
    ok = say(script, head + "1+2=", _tool("print(1 + 2)"))
    say(script, ok + "\n<tool_response>3</tool_response>", "3")
    bad = say(script, head + "4+4=", _tool("open('/etc/shadow').read()"))
    say(script, bad + "\n<tool_response>error: FileNotFoundError: [Errno 2] No such file or "
                      "directory: '/etc/shadow'</tool_response>", "8")
    say(script, head + "9-5=", "5")
    table = Episodes(env="python_tool", n=1, max_turns=3, max_tokens=200,
                     max_episode_tokens=1000).generate(context(), plan(), ScriptedEngine(script),
                                                       None)
    rows = {r[col.PROMPT]: r for r in table.to_pylist()}
    first = rows["1+2="][col.TURNS]
    assert [t["source"] for t in first] == ["environment", "policy", "tool", "policy"]
    assert (first[2]["tool_name"], first[2]["tool_error"]) == ("python", None)
    assert [t["reward"] for t in first] == [None, 0.0, None, 1.0]
    assert rows["1+2="][col.REWARD] == 1.0 and rows["1+2="][EPISODE_END] == "done"
    error = rows["4+4="][col.TURNS][2]["tool_error"]
    assert error.startswith("error: FileNotFoundError") and rows["4+4="][col.REWARD] == 1.0
    assert rows["9-5="][col.REWARD] == 0.0 and len(rows["9-5="][col.TURNS]) == 2
