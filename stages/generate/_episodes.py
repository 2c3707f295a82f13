"""What the endpoint records of an agent's episode, and the trajectories built from it.

**Prompts without re-tokenization.** Every answered call leaves a :class:`Context`: the
request's messages with the assistant's reply appended, and the ids behind them (the
call's prompt ids, then the ids the engine generated). A later request whose messages
extend a context (same tools, the context's messages first, the reply as it was returned)
gets that context's ids as its prefix and only its new messages are rendered
(:meth:`~stages.endpoint._openai_chat.OpenAIChat.extend`); generated text is never encoded
again. Any other request is rendered whole.

**Trajectories.** After the episode, its calls become rows (:func:`trajectories`): a call
whose prompt ids start with a trajectory's ids so far (its last call's prompt and
generated ids) is that trajectory's next turn: the new ids are an environment (or tool)
turn, out of the loss, and the generated ids a policy turn with their logprobs. A call
that extends no trajectory starts a new one, a branch whose ``parent_id`` is the
trajectory it shares the longest token prefix with (rLLM and verifiers split such
episodes the same way).
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from typing import Any

from gfcr.core.engine import GenOutput
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


# --------------------------------------------------------------------------- trajectories


@dataclass
class Trajectory:
    """One row's turns as ids, and the branch it came from (an index, or None)."""

    prompt_ids: list[int]
    turns: list[dict[str, Any]]
    parent: int | None
    outputs: list[GenOutput]

    def ids(self) -> list[int]:
        return self.prompt_ids + [t for turn in self.turns for t in turn["token_ids"]]


def trajectories(calls: list[Call]) -> list[Trajectory]:
    """The episode's calls, in order, as trajectories (see the module docstring)."""
    out: list[Trajectory] = []
    for call in calls:
        assert call.output is not None, "only answered calls are recorded"
        extended = next((t for t in reversed(out) if _extends(call.prompt_ids, t.ids())), None)
        if extended is None:
            parent = _closest(call.prompt_ids, out)
            extended = Trajectory(call.prompt_ids, [], parent, [])
            out.append(extended)
        else:
            delta = call.prompt_ids[len(extended.ids()):]
            extended.turns.append(_env_turn(delta, call))
        extended.turns.append(policy_turn(call.output))
        extended.outputs.append(call.output)
    return out


def _extends(prompt: list[int], ids: list[int]) -> bool:
    return len(prompt) >= len(ids) and prompt[:len(ids)] == ids


def _closest(prompt: list[int], rows: list[Trajectory]) -> int | None:
    """The trajectory sharing the longest token prefix with ``prompt`` (latest on ties)."""
    best, best_len = None, -1
    for i, row in enumerate(rows):
        ids, n = row.ids(), 0
        while n < min(len(ids), len(prompt)) and ids[n] == prompt[n]:
            n += 1
        if n >= best_len:
            best, best_len = i, n
    return best


def _env_turn(ids: list[int], call: Call) -> dict[str, Any]:
    tool = call.role == "tool"
    return {"role": call.role, "source": "tool" if tool else "environment", "token_ids": ids,
            "logprobs": None, "mask": None,
            "tool_name": ",".join(call.tool_names) if tool else None,
            "tool_error": None, "reward": None}


def policy_turn(out: GenOutput) -> dict[str, Any]:
    """The generated ids of a call as a policy turn, in the loss, with their logprobs."""
    return {"role": "assistant", "source": "policy", "token_ids": list(out.completion_ids),
            "logprobs": list(out.logprobs), "mask": [True] * len(out.completion_ids),
            "tool_name": None, "tool_error": None, "reward": None}
