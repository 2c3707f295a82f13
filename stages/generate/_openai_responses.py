"""The OpenAI Responses API (``POST /v1/responses``) on gfcr's chat endpoint, token-exact.

A Responses request is translated into a chat-completions request and served by the
same path (:meth:`stages.generate.openai_api.AgentServer.chat`: the same limits, call
count, turn-waves and episode record), and the chat answer is translated back, so the
ids and logprobs stored are the engine's exactly as for chat completions, and a
conversation that sends back the output items it received extends its stored ids
without re-tokenising them (the items map back to the assistant message the endpoint
returned).

What is translated: ``instructions`` (a system message first); ``input`` as a string (one
user message) or a list of items: messages (``role`` user, system, developer or
assistant; ``content`` a string or ``input_text``/``output_text`` parts),
``function_call`` items (the assistant's tool calls) and ``function_call_output`` items
(tool results); ``reasoning`` items are skipped; function ``tools``; ``max_output_tokens``.
gfcr keeps no responses, so ``previous_response_id`` is refused (send the whole
input), as are ``stream`` and tools that are not functions. The answer's ``output`` is a
``message`` item with the text (when there is text) and one ``function_call`` item per
tool call; ``status`` is ``incomplete`` (reason ``max_output_tokens``) when the cap cut
the answer.
"""

from __future__ import annotations

import secrets
from typing import Any, Callable

from stages.endpoint._http import ApiError

ROLES = {"user", "system", "developer", "assistant"}


def responses(chat: Callable[[dict[str, Any]], dict[str, Any]], body: Any) -> dict[str, Any]:
    """Serve a Responses request through ``chat`` (a chat-completions call)."""
    return from_chat(chat(to_chat(body)), body)


def to_chat(body: Any) -> dict[str, Any]:
    """The chat-completions request of a Responses one, or ApiError naming what is wrong."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    if body.get("previous_response_id") is not None:
        raise ApiError(400, "previous_response_id is not supported: gfcr keeps no "
                            "responses; send the whole conversation as input")
    messages: list[dict[str, Any]] = []
    if body.get("instructions") is not None:
        if not isinstance(body["instructions"], str):
            raise ApiError(400, "instructions must be a string")
        messages.append({"role": "system", "content": body["instructions"]})
    given = body.get("input")
    if isinstance(given, str):
        messages.append({"role": "user", "content": given})
    elif isinstance(given, list) and given:
        for i, item in enumerate(given):
            _item(messages, item, i)
    else:
        raise ApiError(400, "input must be a string or a non-empty list of items")
    out: dict[str, Any] = {"messages": messages, "stream": body.get("stream", False)}
    if body.get("tools"):
        out["tools"] = _tools(body["tools"])
    if body.get("max_output_tokens") is not None:
        out["max_tokens"] = body["max_output_tokens"]
    return out


def _item(messages: list[dict[str, Any]], item: Any, i: int) -> None:
    if not isinstance(item, dict):
        raise ApiError(400, f"input[{i}] must be an object")
    kind = item.get("type", "message")
    if kind == "message":
        if item.get("role") not in ROLES:
            raise ApiError(400, f"input[{i}].role must be one of {sorted(ROLES)}")
        messages.append({"role": item["role"], "content": _text(item.get("content"), i)})
    elif kind == "function_call":
        call = {"id": _str(item, "call_id", i), "type": "function",
                "function": {"name": _str(item, "name", i),
                             "arguments": _str(item, "arguments", i)}}
        last = messages[-1] if messages else None
        if last is not None and last["role"] == "assistant":
            last.setdefault("tool_calls", []).append(call)
        else:
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
    elif kind == "function_call_output":
        output = item.get("output")
        messages.append({"role": "tool", "tool_call_id": _str(item, "call_id", i),
                         "content": output if isinstance(output, str) else _text(output, i)})
    elif kind != "reasoning":
        raise ApiError(400, f"input[{i}].type {str(kind)[:40]!r} is not served by gfcr's "
                            "endpoint (message, function_call, function_call_output)")


def _text(content: Any, i: int) -> str | None:
    """A message's text: a string, or its text parts joined."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list) and all(
            isinstance(p, dict) and p.get("type") in ("input_text", "output_text", "text")
            and isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    raise ApiError(400, f"input[{i}].content must be a string or a list of text parts "
                        "(input_text / output_text)")


def _str(item: dict[str, Any], key: str, i: int) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise ApiError(400, f"input[{i}].{key} must be a string")
    return value


def _tools(tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise ApiError(400, "tools must be a list of function tools")
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(
                tool.get("name"), str):
            raise ApiError(400, f"tools[{i}] must be a function tool "
                                "({'type': 'function', 'name': ..., 'parameters': ...})")
        out.append({"type": "function", "function": {
            "name": tool["name"], "description": tool.get("description") or "",
            "parameters": tool.get("parameters") or {"type": "object", "properties": {}}}})
    return out


def from_chat(answer: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
    """The Responses object of a chat-completions answer."""
    choice = answer["choices"][0]
    reply = choice["message"]
    output: list[dict[str, Any]] = []
    if reply.get("content") is not None:
        output.append({"type": "message", "id": f"msg_{secrets.token_hex(8)}",
                       "status": "completed", "role": "assistant",
                       "content": [{"type": "output_text", "text": reply["content"],
                                    "annotations": []}]})
    for call in reply.get("tool_calls") or []:
        output.append({"type": "function_call", "id": f"fc_{secrets.token_hex(8)}",
                       "call_id": call["id"], "name": call["function"]["name"],
                       "arguments": call["function"]["arguments"], "status": "completed"})
    cut = choice["finish_reason"] == "length"
    usage = answer["usage"]
    return {"id": f"resp_{secrets.token_hex(8)}", "object": "response",
            "created_at": answer["created"], "model": answer["model"],
            "status": "incomplete" if cut else "completed",
            "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
            "error": None, "instructions": body.get("instructions"), "output": output,
            "parallel_tool_calls": True, "tool_choice": "auto",
            "tools": body.get("tools") or [], "temperature": None, "top_p": None,
            "metadata": {},
            "usage": {"input_tokens": usage["prompt_tokens"],
                      "output_tokens": usage["completion_tokens"],
                      "total_tokens": usage["total_tokens"],
                      "input_tokens_details": {"cached_tokens": 0},
                      "output_tokens_details": {"reasoning_tokens": 0}}}
