"""What the endpoint records of an agent's episode, and the trajectories built from it.

**Prompts without re-tokenization.** Every answered call leaves a :class:`Context`: the
request's messages with the assistant's reply appended, and the ids behind them (the
call's prompt ids, then the ids the engine generated). A later request whose messages
extend a context (same tools, the context's messages first, the reply as it was returned)
gets that context's ids as its prefix and only its new messages are rendered
(:meth:`~stages.endpoint._openai_chat.OpenAIChat.extend`); generated text is never encoded
again. Any other request is rendered whole.

**Trajectories.** After the episode, its calls (each an
:class:`gfcr.core.trajectory.Exchange`: :meth:`Call.exchange`) become trajectories, one
row each (:func:`gfcr.core.trajectory.branches`): a call that extends a trajectory's ids
is its next turn, one that extends none starts a branch.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from typing import Any

from gfcr.core.engine import GenOutput
from gfcr.core.trajectory import Exchange
from stages.endpoint._openai_chat import OpenAIChat, text_of


@dataclass(frozen=True)
class Context:
    """A conversation served so far: messages (normalised) and their exact ids."""

    messages: tuple[str, ...]
    tools: str
    ids: list[int]
    closed: bool
    """The last assistant turn ended with a stop token (else it was cut by the cap)."""


@dataclass
class Call:
    """One answered call: the prompt ids it was given and what the engine returned."""

    prompt_ids: list[int]
    role: str
    """Role of the last message new in this call ("user", "tool", ...)."""
    tool_names: list[str] = field(default_factory=list)
    """Tools whose results are among the call's new messages."""
    output: GenOutput | None = None
    """What the engine generated; None until the call is answered."""

    def exchange(self) -> Exchange:
        """The answered call as the trajectory module reads it."""
        assert self.output is not None, "only answered calls are recorded"
        return Exchange(self.prompt_ids, list(self.output.completion_ids),
                        list(self.output.logprobs), self.role, tuple(self.tool_names))


@dataclass
class Episode:
    """One agent run's calls and contexts; the server's threads share it (``lock``)."""

    index: int
    codec: OpenAIChat
    max_tokens: int | None = None
    """The task's cap on one call's tokens (the plan's ``max_tokens``); None: the stage's."""
    calls: list[Call] = field(default_factory=list)
    contexts: list[Context] = field(default_factory=list)
    asked: int = 0
    """Calls received, answered or not."""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def prompt(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
               ) -> tuple[list[int], Call]:
        """The prompt ids of a request (a stored context's ids and the rest rendered,
        or all of it rendered) and its call record, to be completed with the output."""
        keys, tools_key = [normal(m) for m in messages], json.dumps(tools, sort_keys=True)
        with self.lock:
            best = max((c for c in self.contexts if c.tools == tools_key
                        and len(c.messages) < len(keys)
                        and tuple(keys[:len(c.messages)]) == c.messages),
                       key=lambda c: len(c.messages), default=None)
        if best is None:
            ids = self.codec.render(messages, tools)
            new = messages
        else:
            new = messages[len(best.messages):]
            ids = best.ids + self.codec.extend(new, messages, best.closed)
        return ids, Call(prompt_ids=ids, role=str(new[-1]["role"]) if new else "user",
                         tool_names=_tool_names(messages, new))

    def admit(self, limit: int) -> bool:
        """Count a call received; False once ``limit`` calls were."""
        with self.lock:
            self.asked += 1
            return self.asked <= limit

    def answered(self, call: Call, out: GenOutput, messages: list[dict[str, Any]],
                 tools: Any, reply: dict[str, Any]) -> None:
        """Record ``call`` answered with ``out``, and the context it leaves."""
        call.output = out
        closed = bool(out.completion_ids) and out.completion_ids[-1] in self.codec.format.ends
        keys = tuple(normal(m) for m in [*messages, reply])
        with self.lock:
            self.calls.append(call)
            self.contexts.append(Context(keys, json.dumps(tools, sort_keys=True),
                                         call.prompt_ids + out.completion_ids, closed))


def normal(message: dict[str, Any]) -> str:
    """What makes two messages the same turn: role, text, and the calls' names and
    arguments (not their ids, nor the fields a client adds, such as ``refusal``)."""
    calls = [(c["function"]["name"], c["function"]["arguments"])
             for c in message.get("tool_calls") or []]
    return json.dumps([message.get("role"), text_of(message), calls])


def _tool_names(messages: list[dict[str, Any]], new: list[dict[str, Any]]) -> list[str]:
    """Names of the tools whose results are in ``new`` (through their call ids)."""
    names = {c.get("id"): c["function"]["name"] for m in messages
             for c in m.get("tool_calls") or []}
    return [names.get(m.get("tool_call_id"), m.get("name") or "?") for m in new
            if m.get("role") == "tool"]
