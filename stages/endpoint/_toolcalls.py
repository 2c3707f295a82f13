"""The tool-call format the endpoint reads from generated text.

A policy calls a tool by writing, anywhere in its turn, one block per call::

    <tool_call>{"name": "calc", "arguments": {"expression": "3*7"}}</tool_call>

(the Hermes / Qwen2.5 convention, which many open chat models are trained on). The
endpoint returns each well-formed block as an OpenAI ``tool_calls`` entry (``arguments``
as a JSON string, as the API has it) and the text outside the blocks as ``content``. A
block that is not a JSON object with a string ``name``, or that names a tool the request
did not declare, stays in ``content`` as plain text: the agent sees what the policy wrote,
and the trajectory's tokens are the generated ones either way.
"""

from __future__ import annotations

import json
import re
from typing import Any

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(re.escape(OPEN) + r"(.*?)" + re.escape(CLOSE), re.DOTALL)


def parse(text: str, declared: set[str], call_id: str) -> tuple[str | None, list[dict[str, Any]]]:
    """``(content, tool_calls)`` of a generated turn. ``declared``: the request's tool
    names (empty: no tools, every block stays text); ``call_id`` prefixes the calls' ids."""
    calls: list[dict[str, Any]] = []
    kept: list[str] = []
    last = 0
    for match in _BLOCK.finditer(text):
        call = _call(match.group(1), declared)
        if call is None:
            continue
        kept.append(text[last:match.start()])
        last = match.end()
        name, arguments = call
        calls.append({"id": f"{call_id}_{len(calls)}", "type": "function",
                      "function": {"name": name, "arguments": arguments}})
    kept.append(text[last:])
    content = "".join(kept).strip() if calls else text
    return (content or None) if calls else content, calls


def _call(body: str, declared: set[str]) -> tuple[str, str] | None:
    try:
        value = json.loads(body)
    except ValueError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    if value["name"] not in declared:
        return None
    arguments = value.get("arguments", {})
    if isinstance(arguments, str):
        return value["name"], arguments
    return value["name"], json.dumps(arguments)


def block(name: str, arguments: str) -> str:
    """The text of one call in this format (how an assistant message that comes back as
    text, not as stored ids, is rendered)."""
    try:
        args: Any = json.loads(arguments)
    except ValueError:
        args = arguments
    return OPEN + json.dumps({"name": name, "arguments": args}) + CLOSE


def declared_names(tools: list[dict[str, Any]] | None) -> set[str]:
    """Names of a request's function tools."""
    out = set()
    for tool in tools or []:
        function = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            out.add(function["name"])
    return out
