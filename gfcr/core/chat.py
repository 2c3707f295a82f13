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
  with their logprobs, in the loss (:meth:`Trajectory.add_policy`);
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

:class:`Trajectory` holds the turns (``gfcr.core.rollout.TURN_TYPE`` rows) and the flat
columns they imply (``prompt_ids``: the first turn; ``completion_ids``: the rest, in
order; ``logprobs``: the policy's, 0 for observation tokens).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence, runtime_checkable

from gfcr.core.chattext import template_ids
from gfcr.core.engine import Tokenizer, stop_token_ids
from gfcr.core.environment import Message, Tool


@runtime_checkable
class RendersChat(Protocol):
    """A tokenizer with a chat template: ``chat`` says whether prompts go through it.
    ``encode`` reads text as text (no special ids from it); ``encode_template`` reads the
    template's markup, its special strings (``specials``) as their ids
    (:mod:`gfcr.core.chattext`)."""

    chat: bool
    @property
    def specials(self) -> tuple[str, ...]: ...

    def encode(self, text: str) -> list[int]: ...

    def encode_template(self, text: str) -> list[int]: ...

    def render_chat(self, messages: list[dict[str, Any]], *, tools: list[dict[str, Any]] | None,
                    add_generation_prompt: bool) -> str: ...


class ChatFormat(Protocol):
    """How messages become ids: the first messages once, later ones as deltas."""

    ends: frozenset[int]
    """Token ids that end a policy turn (EOS, end of turn)."""

    def first(self, messages: list[Message], tools: list[Tool]) -> list[int]:
        """Ids of the conversation's first messages, ready for the policy's turn."""
        ...

    def delta(self, messages: list[Message], closed: bool) -> list[int]:
        """Ids to append after a policy turn so the conversation goes on with
        ``messages`` and then the policy's next turn; ``closed``: that turn ended with
        one of :attr:`ends` (else the delta closes it first)."""
        ...


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


@dataclass
class Turn:
    """One turn of a trajectory, in ``gfcr.core.rollout.TURN_TYPE``'s fields."""

    role: str
    source: str
    token_ids: list[int]
    logprobs: list[float] | None = None
    mask: list[bool] | None = None
    tool_name: str | None = None
    tool_error: str | None = None
    reward: float | None = None

    def as_row(self) -> dict[str, Any]:
        return {"role": self.role, "source": self.source, "token_ids": self.token_ids,
                "logprobs": self.logprobs, "mask": self.mask, "tool_name": self.tool_name,
                "tool_error": self.tool_error, "reward": self.reward}


@dataclass
class Trajectory:
    """A conversation as turns of token ids, built by appending (never re-rendering)."""

    format: ChatFormat
    turns: list[Turn] = field(default_factory=list)

    def start(self, messages: list[Message], tools: Sequence[Tool] = ()) -> None:
        """The first turn: ``messages`` rendered once (an environment turn)."""
        if self.turns:
            raise ValueError("the trajectory has already started")
        self.turns.append(Turn(_role(messages), "environment",
                               self.format.first(messages, list(tools))))

    def add_policy(self, ids: list[int], logprobs: list[float]) -> None:
        """The policy's turn: its ids exactly as generated, in the loss."""
        if len(ids) != len(logprobs):
            raise ValueError(f"a policy turn has {len(ids)} ids but {len(logprobs)} logprobs")
        self.turns.append(Turn("assistant", "policy", list(ids), list(logprobs),
                               [True] * len(ids)))

    def observe(self, messages: list[Message], *, tool_name: str | None = None,
                tool_error: str | None = None) -> None:
        """Append an observation after the policy's last turn, as its delta's ids."""
        last = self.turns[-1] if self.turns else None
        if last is None or last.source != "policy":
            raise ValueError("an observation must follow a policy turn")
        closed = bool(last.token_ids) and last.token_ids[-1] in self.format.ends
        ids = self.format.delta(messages, closed)
        role = _role(messages)
        source = "tool" if role == "tool" or tool_name is not None else "environment"
        self.turns.append(Turn(role, source, ids, tool_name=tool_name,
                               tool_error=tool_error))

    def reward_last(self, reward: float | None) -> None:
        """Give the policy's last turn its reward."""
        if reward is not None:
            policy = [t for t in self.turns if t.source == "policy"]
            policy[-1].reward = float(reward)

    def ids(self) -> list[int]:
        """Every token so far: the context the policy's next turn continues."""
        return [i for t in self.turns for i in t.token_ids]

    @property
    def prompt_ids(self) -> list[int]:
        return list(self.turns[0].token_ids)

    @property
    def completion_ids(self) -> list[int]:
        return [i for t in self.turns[1:] for i in t.token_ids]

    @property
    def logprobs(self) -> list[float]:
        """The policy's logprobs, 0 for every token of a turn without any."""
        return [lp for t in self.turns[1:]
                for lp in (t.logprobs if t.logprobs is not None else [0.0] * len(t.token_ids))]

    def policy_tokens(self) -> int:
        return sum(len(t.token_ids) for t in self.turns if t.source == "policy")

    def reward(self) -> float | None:
        """The sum of the turns' rewards; None when no turn has one."""
        given = [t.reward for t in self.turns if t.reward is not None]
        return float(sum(given)) if given else None

    def rows(self) -> list[dict[str, Any]]:
        """The ``turns`` column's value."""
        return [t.as_row() for t in self.turns]


def _role(messages: list[Message]) -> str:
    roles = {m.role for m in messages}
    return roles.pop() if len(roles) == 1 else "user"
