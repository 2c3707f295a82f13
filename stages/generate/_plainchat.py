"""A plain-text chat format for a policy whose tokenizer has no chat template (the tiny
policy's byte or character tokenizer), in token space.

Messages are rendered as ``"<Role>: <content>\\n"`` lines, the tools the request declares
as a system line listing their JSON schemas and the call format
(:mod:`stages.generate._toolcalls`); an assistant turn ends with the tokenizer's EOS id,
and the generation prompt is ``"Assistant:"``. Every piece is encoded on its own and the
ids are concatenated, so a conversation is extended by appending the ids of its new
messages, never by re-encoding what came before (:meth:`PlainChat.extend`).
"""

from __future__ import annotations

from typing import Any, Protocol

from stages.generate._toolcalls import block


class ChatCodec(Protocol):
    """Messages to token ids, in the way a policy was (or will be) trained to read them."""

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
               ) -> list[int]:
        """A whole conversation's ids, the assistant's generation prompt last."""
        ...

    def extend(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
               closed: bool) -> list[int]:
        """The ids to append after an assistant turn whose ids are kept as generated:
        its end-of-turn marker when ``closed`` is False (it was cut by the token cap),
        then ``messages`` (none of them an assistant's), then the generation prompt."""
        ...


class PlainChat:
    """:class:`ChatCodec` over any tokenizer with ``encode`` and an EOS id."""

    ROLES = {"system": "System", "developer": "System", "user": "User", "tool": "Tool",
             "assistant": "Assistant"}

    def __init__(self, encode: Any, eos_id: int) -> None:
        self.encode, self.eos_id = encode, eos_id

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
               ) -> list[int]:
        ids = self.encode(tools_line(tools)) if tools else []
        for message in messages:
            ids += self._message(message)
        return ids + self.encode("Assistant:")

    def extend(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
               closed: bool) -> list[int]:
        ids = [] if closed else [self.eos_id]
        for message in messages:
            ids += self._message(message)
        return ids + self.encode("Assistant:")

    def _message(self, message: dict[str, Any]) -> list[int]:
        role = message["role"]
        if role == "assistant":
            calls = "".join(block(c["function"]["name"], c["function"]["arguments"])
                            for c in message.get("tool_calls") or [])
            return self.encode(f"Assistant:{text_of(message)}{calls}") + [self.eos_id]
        return self.encode(f"{self.ROLES[role]}: {text_of(message)}\n")


def tools_line(tools: list[dict[str, Any]] | None) -> str:
    """The system line that declares ``tools`` (name, parameters, description: short, for
    small models) and how to call them."""
    decls = []
    for tool in tools or []:
        fn = tool.get("function", tool)
        params = (fn.get("parameters") or {}).get("properties") or {}
        decls.append(f"{fn.get('name')}({', '.join(params)})"
                     + (f": {str(fn['description']).rstrip('.')}" if fn.get("description") else ""))
    return (f"System: Tools: {'; '.join(decls)}. Call one as <tool_call>{{\"name\": ..., "
            f"\"arguments\": {{...}}}}</tool_call>\n")


def text_of(message: dict[str, Any]) -> str:
    """A message's text: its ``content`` string, or its text parts joined."""
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") for p in content if isinstance(p, dict))
