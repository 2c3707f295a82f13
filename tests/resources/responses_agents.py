"""Agents written against the real ``openai`` client's Responses API
(``client.responses.create``), for gfcr's ``/v1/responses``."""

from __future__ import annotations

import json
from typing import Any

CALCULATOR = [{"type": "function", "name": "calculator", "description": "Evaluate arithmetic",
               "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}}}]
SEEN: list[Any] = []
"""The responses the agents got, in call order per thread."""


def three_turns(client: Any, task: dict) -> float:
    """A conversation of three calls, each sending back the output items it got."""
    items: list[Any] = [{"role": "user", "content": task["question"]}]
    for follow_up in ("Are you sure?", "Final answer:"):
        reply = client.responses.create(model="m", input=items, max_output_tokens=6,
                                        instructions="Answer briefly.")
        SEEN.append(reply)
        items += [o.model_dump(exclude_none=True) for o in reply.output]
        items.append({"role": "user", "content": follow_up})
    SEEN.append(client.responses.create(model="m", input=items, max_output_tokens=6,
                                        instructions="Answer briefly."))
    return 0.25


def tool_user(client: Any, task: dict) -> float:
    """Asks with the calculator declared, runs the call the policy makes, asks again."""
    items: list[Any] = [{"role": "user", "content": task["question"]}]
    reply = client.responses.create(model="m", input=items, tools=CALCULATOR,
                                    max_output_tokens=100)
    SEEN.append(reply)
    items += [o.model_dump(exclude_none=True) for o in reply.output]
    result = "none"
    for call in [o for o in reply.output if o.type == "function_call"]:
        expression = json.loads(call.arguments)["expression"]
        result = str(eval(expression, {"__builtins__": {}}))  # the test's own fixed text
        items.append({"type": "function_call_output", "call_id": call.call_id,
                      "output": result})
    SEEN.append(client.responses.create(model="m", input=items, tools=CALCULATOR,
                                        max_output_tokens=4))
    return 1.0 if result == "21" else 0.0
