"""An arithmetic agent with a Python tool, written against the ``openai`` client: it
declares a ``python`` function tool, runs each call the model makes in gfcr's sandbox
(stages.envs.tools.PythonTool), sends the output back as a tool message, and returns 1.0
when the last number of the final answer is the reference. gfcr trains the model behind
the client (pipelines/smol_agent_openai.py):

    AgentEnv(agent="examples.agent_python:solve", n=4)

The system message and the call format are the ``python_tool`` environment's
(stages/envs/python_tool.py), so one warm start on its demonstrations
(stages/envs/python_demos.py) serves both pipelines: the endpoint renders this
conversation through the model's chat template to the same ids an Episodes run holds.
A reply with a ``<tool_call>`` block the endpoint could not read as a call (not JSON,
unknown tool) counts as a failed call; the reward's components ``tool_calls`` and
``tool_errors`` say how many calls the episode made and how many failed (the step's
``tool/*`` metrics read them, gfcr.runner.tool_metrics).

It runs unchanged against any OpenAI-compatible server:

    python examples/agent_python.py http://localhost:8000/v1 "What is 4821 - 967?"
"""

from __future__ import annotations

import json
import sys
from typing import Any

import openai

from stages.envs.answers import same_number
from stages.envs.python_tool import INSTRUCTIONS
from stages.envs.tools import PYTHON, PythonTool

TOOLS: Any = [PYTHON.as_dict()]
"""The python tool as an OpenAI function tool."""
MAX_TURNS = 2
"""Model calls per episode: a tool call, then the answer."""
MAX_TOKENS = 48
"""Tokens per model call (a call is about 40 SmolLM2 tokens)."""


def solve(client: openai.OpenAI, task: dict[str, Any]) -> tuple[float, dict[str, float]]:
    """Answer ``task["question"]``, running the python tool when the model calls it."""
    model = client.models.list().data[0].id
    messages: list[Any] = [{"role": "system", "content": INSTRUCTIONS},
                           {"role": "user", "content": task["question"]}]
    tool, answer, calls, errors = PythonTool(), "", 0, 0
    for _ in range(MAX_TURNS):
        reply = client.chat.completions.create(model=model, messages=messages, tools=TOOLS,
                                               max_tokens=MAX_TOKENS)
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        answer = message.content or ""
        if not message.tool_calls:
            if "<tool_call>" in answer:  # a call the endpoint could not read
                calls, errors = calls + 1, errors + 1
                answer = ""
            break
        for call in message.tool_calls:
            function = getattr(call, "function", None)  # (a custom tool call has none)
            output, error = (_run(tool, function.name, function.arguments) if function
                             else ("error: not a function call", "not a function call"))
            calls, errors = calls + 1, errors + (error is not None)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": output})
    right = same_number(answer, task.get("answer"))
    return float(right), {"tool_calls": float(calls), "tool_errors": float(errors)}


def _run(tool: PythonTool, name: str, arguments: str) -> tuple[str, str | None]:
    """(output, error) of one call (``arguments``: the call's JSON string)."""
    try:
        parsed = json.loads(arguments)
    except ValueError:
        parsed = None
    if name != PYTHON.name or not isinstance(parsed, dict):
        error = f"the call is not python with JSON arguments ({name!r})"
        return f"error: {error}", error
    return tool.run(parsed)


if __name__ == "__main__":
    url, question = sys.argv[1], sys.argv[2]
    print(solve(openai.OpenAI(base_url=url, api_key="none"), {"question": question,
                                                                "answer": None}))
