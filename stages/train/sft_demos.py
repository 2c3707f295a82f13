"""Multi-turn demonstrations for the supervised warm start: whole episodes, tool turns
out of the loss.

A single-turn warm start (``answer + EOS`` after the prompt) cannot teach a policy to
call a tool: the call, the tool's output and the answer that reads it span three turns.
A demonstration is a conversation (:class:`Demonstration`: messages and the tools
declared) built from a training row by a ``module:function`` the warm start names
(``SFT(demonstrations=...)``). It becomes ids the way an episode does
(:class:`gfcr.core.trajectory.Trajectory` over :func:`gfcr.chat.formats.chat_format`): the
messages before the first assistant turn are the prompt, rendered once with the tools;
each assistant message is its text's ids and the end-of-turn id, in the loss; every
other message (a tool's output, a user's reply) is the rendered delta after the
assistant's turn, out of the loss, as Episodes and AgentEnv mask them. So the warm start
trains on exactly the token layout the policy will generate into.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from gfcr.chat.formats import chat_format
from gfcr.config import refs
from gfcr.core.environment import Message, Tool
from gfcr.core.trajectory import Trajectory


@dataclass(frozen=True)
class Demonstration:
    """A conversation to imitate: ``messages`` (at least one assistant message after
    the first non-assistant ones) and the ``tools`` its first turn declares."""

    messages: list[Message]
    tools: list[Tool] = field(default_factory=list)


@dataclass(frozen=True)
class Example:
    """One warm-start example as ids: ``prompt``, ``completion`` and, per completion
    token, whether it is in the loss (``mask``: the assistant's tokens)."""

    prompt: list[int]
    completion: list[int]
    mask: list[bool]


def resolve(ref: str) -> Callable[[dict[str, Any]], Demonstration]:
    """The demonstration function ``ref`` (``module:function``) names."""
    fn = refs.resolve(ref, "sft demonstrations")
    if not callable(fn):
        raise ValueError(f"sft demonstrations {ref!r} is not a function")
    return fn


def encode(tokenizer: Any, demo: Demonstration) -> Example:
    """The ids of ``demo`` as an episode would hold them (module docstring)."""
    messages = demo.messages
    first = next((i for i, m in enumerate(messages) if m.role == "assistant"), None)
    if not first:
        raise ValueError("sft demonstrations: a demonstration needs prompt messages and "
                         f"then an assistant message (got roles {[m.role for m in messages]})")
    traj = Trajectory(chat_format(tokenizer)).start(messages[:first], demo.tools)
    waiting: list[Message] = []
    for m in messages[first:]:
        if m.role != "assistant":
            waiting.append(m)
            continue
        if waiting:
            traj.observe(waiting)
            waiting = []
        ids = list(tokenizer.encode(m.content)) + [int(tokenizer.eos_token_id)]
        traj.add_policy(ids, [0.0] * len(ids))
    if waiting:
        raise ValueError("sft demonstrations: a demonstration must end with an assistant "
                         "message")
    flat = traj.flat()
    return Example(flat.prompt_ids, flat.completion_ids, flat.loss_mask)
