"""Chat-template output as ids, with the special tokens only where the template put them.

A chat template's text holds two kinds of thing: the template's own markup
(``<|im_start|>user\\n``, ``<|im_end|>``), whose special-token strings must become their
special ids, and the messages' text (a task prompt, an environment's observation, a tool's
output, an agent's message), which must stay text. Tokenizing the whole rendering with
special-token parsing on (what ``tokenizer.encode(rendered)`` does) reads a tool result
holding ``<|im_end|>\\n<|im_start|>assistant`` as a closed turn and a new assistant turn:
content forges turns (chat-template injection, the "special token injection" of Yang et
al. 2024 and of OWASP's LLM01 prompt injection; gfcr's drills P2/P3).

:func:`template_ids` keeps the two apart. A conversation whose text holds no special
string is tokenized as before (so ordinary prompts keep their ids). One that does is
rendered a second time with each such message's content replaced by a marker; the
markers split the rendering into template pieces (special strings read as ids) and
content pieces (encoded as text: ``split_special_tokens``). A template that changes
content (trims it, splits reasoning off) cannot be split so; there the special strings
inside the content are escaped instead (a word joiner, U+2060, after their first
character), so they read as text. Tools' fields are escaped the same way.
"""

from __future__ import annotations

import re
import secrets
from typing import Any, Callable, Protocol, Sequence

JOINER = "\u2060"
"""Inserted into a special-token string found in content, so it no longer matches."""


class TemplateCoder(Protocol):
    """What :func:`template_ids` needs of a tokenizer."""

    @property
    def specials(self) -> tuple[str, ...]:
        """The special-token strings the tokenizer reads as ids (``<|im_end|>``, ...)."""
        ...

    def encode(self, text: str) -> list[int]:
        """``text`` as text: special-token strings in it are never read as their ids."""
        ...

    def encode_template(self, text: str) -> list[int]:
        """A template's markup: its special-token strings read as their ids."""
        ...


Render = Callable[[list[dict[str, Any]], list[dict[str, Any]] | None], str]
"""``render(messages, tools)``: the template's text."""


def holds_special(text: Any, specials: Sequence[str]) -> bool:
    """Whether ``text`` (a string; anything else holds none) contains a special string."""
    return isinstance(text, str) and any(s in text for s in specials)


def escape(text: str, specials: Sequence[str]) -> str:
    """``text`` with each special-token string in it broken by :data:`JOINER`."""
    for s in sorted(specials, key=len, reverse=True):
        if len(s) > 1 and s in text:
            text = text.replace(s, s[0] + JOINER + s[1:])
    return text


def template_ids(coder: TemplateCoder, render: Render, messages: list[dict[str, Any]],
                 tools: list[dict[str, Any]] | None) -> list[int]:
    """The ids of ``render(messages, tools)`` with the special ids the template places
    and none from the messages' or tools' text (module docstring)."""
    specials = tuple(s for s in coder.specials if s)
    if tools and _any_special(tools, specials):
        tools = _escaped(tools, specials)
    messages = [_other_fields_escaped(m, specials) for m in messages]
    hostile = [i for i, m in enumerate(messages) if holds_special(m.get("content"), specials)]
    if not hostile:
        return coder.encode_template(render(messages, tools))
    split = _split(coder, render, messages, tools, hostile)
    if split is not None:
        return split
    messages = [dict(m) for m in messages]  # the caller's messages stay as they are
    for i in hostile:
        messages[i]["content"] = escape(str(messages[i].get("content") or ""), specials)
    return coder.encode_template(render(messages, tools))


def _split(coder: TemplateCoder, render: Render, messages: list[dict[str, Any]],
           tools: list[dict[str, Any]] | None, hostile: list[int]) -> list[int] | None:
    """Template pieces read with special ids, the hostile contents as text; None when the
    template does not place content verbatim (each marker once, the rest unchanged)."""
    if not hostile:
        return coder.encode_template(render(messages, tools))
    tag = secrets.token_hex(8)
    marks = {f"\u2063{tag}{n}\u2063": i for n, i in enumerate(hostile)}
    marked = [dict(m) for m in messages]
    for mark, i in marks.items():
        marked[i]["content"] = mark
    skeleton = render(marked, tools)
    if any(skeleton.count(mark) != 1 for mark in marks):
        return None
    pieces = re.split("(" + "|".join(map(re.escape, marks)) + ")", skeleton)
    rebuilt = "".join(messages[marks[p]]["content"] if p in marks else p for p in pieces)
    if rebuilt != render(messages, tools):
        return None
    ids: list[int] = []
    for piece in pieces:
        if piece in marks:
            ids += coder.encode(messages[marks[piece]]["content"])
        elif piece:
            ids += coder.encode_template(piece)
    return ids


def _other_fields_escaped(message: dict[str, Any], specials: Sequence[str]) -> dict[str, Any]:
    """``message`` with special strings escaped in every field but ``content`` (a name, an
    assistant's ``tool_calls`` arguments): the template renders them as text too."""
    others = {k: v for k, v in message.items() if k != "content"}
    if not _any_special(others, specials):
        return message
    return {k: v if k == "content" else _escaped(v, specials) for k, v in message.items()}


def _any_special(value: Any, specials: Sequence[str]) -> bool:
    if isinstance(value, dict):
        return any(_any_special(v, specials) or _any_special(k, specials)
                   for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return any(_any_special(v, specials) for v in value)
    return holds_special(value, specials)


def _escaped(value: Any, specials: Sequence[str]) -> Any:
    if isinstance(value, dict):
        return {_escaped(k, specials): _escaped(v, specials) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_escaped(v, specials) for v in value]
    return escape(value, specials) if isinstance(value, str) else value
