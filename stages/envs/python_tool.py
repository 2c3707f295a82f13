"""Arithmetic with a Python tool: the policy may run code before it answers.

The task's question (a reasoning-gym arithmetic prompt, ``basic_arithmetic`` or
``chain_sum``, or any task with a numeric answer) comes with the Python tool declared
(:data:`stages.envs.tools.PYTHON`). A reply with a tool call
(``<tool_call>{"name": "python", "arguments": {"code": ...}}</tool_call>``) runs the code
in the sandbox and gets its output back as a tool turn; a reply without one is the final
answer, rewarded 1 when its last number is the reference answer. A tool call that fails
(does not parse, names an unknown tool, raises, hits a limit) is recorded on its turn
(``tool_error``) and rewarded ``tool_error_reward`` (0 by default; negative penalises
it), as rStar2-Agent and Fission-GRPO treat tool errors (Shang et al. 2025).
"""

from __future__ import annotations

from typing import Any

from gfcr.core.environment import Message, Step, Tool, register_env
from stages.envs.answers import same_number
from stages.envs.tools import PYTHON, PythonTool, parse_call

INSTRUCTIONS = ('You may run Python with <tool_call>{"name": "python", "arguments": '
                '{"code": "print(1 + 2)"}}</tool_call>. Then reply with the number.')


@register_env("python_tool")
class PythonArithmetic:
    """Answer a numeric question, optionally after running the Python tool."""

    def __init__(self, sandbox: dict[str, Any] | None = None, tool_error_reward: float = 0.0,
                 instructions: str = INSTRUCTIONS) -> None:
        self.tool = PythonTool(**(sandbox or {}))
        self.tool_error_reward, self.instructions = tool_error_reward, instructions
        self.answer: str | None = None
        self.calls = 0

    def tools(self) -> list[Tool]:
        return [PYTHON]

    def reset(self, task: dict[str, Any]) -> list[Message]:
        self.answer, self.calls = task.get("answer"), 0
        return [Message("system", self.instructions), Message("user", task["prompt"])]

    def step(self, reply: str) -> Step:
        call = parse_call(reply)
        if call is None:
            return Step(reward=1.0 if same_number(reply, self.answer) else 0.0, done=True)
        self.calls += 1
        error: str | None
        if call.error is not None:
            output, error = f"error: {call.error}", call.error
        elif call.name != PYTHON.name:
            error = f"unknown tool {call.name!r} (there is: python)"
            output = f"error: {error}"
        else:
            output, error = self.tool.run(call.arguments)
        return Step([Message("tool", output, name=call.name or PYTHON.name)],
                    reward=self.tool_error_reward if error else 0.0,
                    tool_name=call.name or PYTHON.name, tool_error=error)
