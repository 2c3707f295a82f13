"""Conversations in token space: the chat template applied once, then extended by ids.

The ids a learner trains on must be the ids the engine produced. Rendering a
conversation to text and tokenizing it again at every turn breaks that: a BPE tokenizer
merges across the old reply and the new text differently, a template drops or rewrites
earlier turns (a reasoning model's thoughts), and the policy's end-of-turn token comes
back as something else (the retokenization drift of TRL #5224/#5242, verl #6921, ART
#726). So here:

- the first messages are rendered once (:meth:`ChatFormat.first`, with the generation
  prompt);
- the policy's ids are appended exactly as generated, its end-of-turn token included,
  with their logprobs, in the loss (:meth:`gfcr.core.trajectory.Trajectory.add_policy`);
- each later observation is appended as the ids of its rendered *delta* only
  (:meth:`ChatFormat.delta`): what the template would add after a finished assistant
  turn, rendered against a fixed stand-in conversation, never the real one; if the
  policy's turn was cut before its end-of-turn token, the delta starts with the
  template's closing of that turn. Observation tokens are out of the loss.

Two formats: :class:`TemplateFormat` for a tokenizer with a chat template (the
:class:`RendersChat` capability; ``stages.engines.tiny.HFTokenizer`` has it), and
:class:`PlainFormat` for one without (the byte and character tokenizers): messages as
their text joined by newlines, a tool's output inside ``<tool_response>`` tags, a turn
closed by EOS. A single user message renders as its text alone in the plain format, and
through the template with the generation prompt in the other: what
:func:`gfcr.core.engine.encode_prompt` gives a single-turn prompt, so a policy warm-started
on single-turn prompts sees its first turn as it saw them.

:class:`gfcr.core.trajectory.Trajectory` appends the turns these formats render.
"""

from __future__ import annotations

import json
from typing import Any, Protocol, runtime_checkable

from gfcr.chat.specials import template_ids
from gfcr.core.engine import Tokenizer, stop_token_ids
from gfcr.core.environment import Message, Tool
from gfcr.core.trajectory import ChatFormat


@runtime_checkable
class RendersChat(Protocol):
    """A tokenizer with a chat template: ``chat`` says whether prompts go through it.
    ``encode`` reads text as text (no special ids from it); ``encode_template`` reads the
    template's markup, its special strings (``specials``) as their ids
    (:mod:`gfcr.chat.specials`)."""

    chat: bool
    @property
    def specials(self) -> tuple[str, ...]: ...

    def encode(self, text: str) -> list[int]: ...

    def encode_template(self, text: str) -> list[int]: ...

    def render_chat(self, messages: list[dict[str, Any]], *, tools: list[dict[str, Any]] | None,
                    add_generation_prompt: bool) -> str: ...


class PlainFormat:
    """No template: messages as their text, newline-separated; a tool's output as
    ``<tool_response>text</tool_response>``; tools listed first as JSON; a turn is
    closed by EOS. The policy's turn follows the last message directly, after a later
    observation as after the first prompt (a single-turn prompt has no separator
    either), so a policy trained on single-turn prompts sees a familiar ending."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.ends = stop_token_ids(tokenizer)
        self.eos = int(tokenizer.eos_token_id)

    def first(self, messages: list[Message], tools: list[Tool]) -> list[int]:
        head = []
        if tools:
            head.append("Tools: " + json.dumps([t.as_dict()["function"] for t in tools],
                                               sort_keys=True))
        return self.tokenizer.encode("\n".join(head + [_plain(m) for m in messages]))

    def delta(self, messages: list[Message], closed: bool) -> list[int]:
        text = "".join("\n" + _plain(m) for m in messages)
        return ([] if closed else [self.eos]) + self.tokenizer.encode(text)


def _plain(message: Message) -> str:
    if message.role == "tool":
        return f"<tool_response>{message.content}</tool_response>"
    return message.content


STAND_IN = [{"role": "user", "content": "\u2062q\u2062"},
            {"role": "assistant", "content": "\u2062a\u2062"}]
"""The fixed conversation a delta is rendered after (never the real one)."""


class TemplateFormat:
    """Through the tokenizer's chat template. A delta is the text the template adds
    after :data:`STAND_IN` when ``messages`` follow it (with the generation prompt),
    starting right after the assistant's content: the template's closing of the turn
    (e.g. ``<|im_end|>\\n``) and the new messages. Tokenized alone; when the policy
    closed its turn itself, the leading end-of-turn id is dropped (the policy's own is
    kept). A template whose rendering of a longer conversation does not extend the
    shorter one's cannot be extended by ids, and is refused naming it."""

    def __init__(self, tokenizer: Any) -> None:
        if not isinstance(tokenizer, RendersChat):
            raise TypeError(f"{type(tokenizer).__name__} has no chat template (render_chat)")
        self.tokenizer = tokenizer
        self.ends = stop_token_ids(tokenizer)
        base = tokenizer.render_chat(STAND_IN, tools=None, add_generation_prompt=False)
        at = base.rfind(STAND_IN[1]["content"])
        if at < 0:
            raise ValueError("the chat template drops the assistant's content; turns "
                             "cannot be appended as ids")
        self._base, self._closing = base, base[at + len(STAND_IN[1]["content"]):]

    def first(self, messages: list[Message], tools: list[Tool]) -> list[int]:
        def render(ms: list[dict[str, Any]], ts: list[dict[str, Any]] | None) -> str:
            return self.tokenizer.render_chat(ms, tools=ts, add_generation_prompt=True)

        return template_ids(self.tokenizer, render, [m.as_dict() for m in messages],
                            [t.as_dict() for t in tools] or None)

    def delta(self, messages: list[Message], closed: bool) -> list[int]:
        ids = template_ids(self.tokenizer, self._after_stand_in,
                           [m.as_dict() for m in messages], None)
        if not closed:
            return ids
        if not ids or ids[0] not in self.ends:
            raise ValueError(f"the chat template closes an assistant turn with "
                             f"{self._closing!r}, which does not start with a token the "
                             f"policy stops at ({sorted(self.ends)})")
        return ids[1:]

    def _after_stand_in(self, messages: list[dict[str, Any]],
                        tools: list[dict[str, Any]] | None) -> str:
        """The text the template adds after :data:`STAND_IN`'s assistant content when
        ``messages`` follow it (the template's closing of that turn first)."""
        full = self.tokenizer.render_chat(STAND_IN + messages, tools=tools,
                                          add_generation_prompt=True)
        if not full.startswith(self._base):
            raise ValueError("the chat template renders a longer conversation differently "
                             "from the start of a shorter one (it rewrites earlier turns); "
                             "turns cannot be appended as ids: use a template that only "
                             "appends")
        return self._closing + full[len(self._base):]


def chat_format(tokenizer: Tokenizer) -> ChatFormat:
    """The format for ``tokenizer``: its chat template when it has one in use, else plain."""
    if isinstance(tokenizer, RendersChat) and tokenizer.chat:
        return TemplateFormat(tokenizer)
    return PlainFormat(tokenizer)
