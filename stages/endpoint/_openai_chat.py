"""OpenAI chat messages in gfcr's token-space chat (:mod:`gfcr.chat.formats`).

The endpoint receives messages as the OpenAI API has them (dicts, content as a string
or text parts, an assistant's ``tool_calls``, a tool result's ``tool_call_id``) and
tools as function-tool objects; :class:`OpenAIChat` turns them into
:class:`gfcr.core.environment.Message` and :class:`~gfcr.core.environment.Tool` values and renders
them with the policy's :class:`gfcr.core.trajectory.ChatFormat`: a whole conversation once
(:meth:`OpenAIChat.render`), or the new messages after an assistant turn kept as
generated (:meth:`OpenAIChat.extend`). An assistant message that is rendered from its
text (a conversation the endpoint did not serve) has its tool calls written in the
format the endpoint reads them in (:mod:`stages.endpoint._toolcalls`).
"""

from __future__ import annotations

from typing import Any

from gfcr.core.trajectory import ChatFormat
from gfcr.core.environment import Message, Tool
from stages.endpoint._toolcalls import block

ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant",
         "tool": "tool"}
"""OpenAI roles -> gfcr's (a developer message is a system message to an open model)."""


class OpenAIChat:
    """OpenAI messages to ids through a :class:`~gfcr.core.trajectory.ChatFormat`."""

    def __init__(self, format: ChatFormat) -> None:
        self.format = format

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
               ) -> list[int]:
        """A whole conversation's ids, ready for the assistant's turn."""
        return self.format.first(to_messages(messages, messages), to_tools(tools))

    def extend(self, new: list[dict[str, Any]], every: list[dict[str, Any]],
               closed: bool) -> list[int]:
        """The ids of ``new`` (the last messages of ``every``) after an assistant turn
        kept as generated; ``closed``: that turn ended with an end-of-turn id."""
        return self.format.delta(to_messages(new, every), closed)


def to_messages(messages: list[dict[str, Any]], every: list[dict[str, Any]]) -> list[Message]:
    """gfcr messages of OpenAI ones; a tool result is named after the call it answers
    (looked up in ``every``, the whole conversation)."""
    calls = {c.get("id"): c["function"]["name"] for m in every
             for c in m.get("tool_calls") or []}
    out = []
    for m in messages:
        role = ROLES[m["role"]]
        text = text_of(m) + "".join(block(c["function"]["name"], c["function"]["arguments"])
                                    for c in m.get("tool_calls") or [])
        name = calls.get(m.get("tool_call_id"), m.get("name")) if role == "tool" else None
        out.append(Message(role, text, name))  # type: ignore[arg-type]
    return out


def to_tools(tools: list[dict[str, Any]] | None) -> list[Tool]:
    """gfcr tools of OpenAI function tools."""
    out = []
    for t in tools or []:
        fn = t.get("function", t)
        out.append(Tool(str(fn.get("name")), str(fn.get("description") or ""),
                        fn.get("parameters") or {"type": "object", "properties": {}}))
    return out


def text_of(message: dict[str, Any]) -> str:
    """A message's text: its ``content`` string, or its text parts joined."""
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") for p in content if isinstance(p, dict))
