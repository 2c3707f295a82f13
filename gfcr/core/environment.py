"""Environments: what answers the policy between its turns in a multi-turn rollout.

An environment is a plain class, one instance per episode (the ``episodes`` generate
stage, :mod:`stages.generate.episodes`, makes one for every trajectory it samples):

- ``reset(task) -> list[Message]``: the episode's first messages from a task row (the
  row's ``prompt``, ``answer`` and ``meta`` as a dict); they are rendered once through
  the policy's chat template (:mod:`gfcr.chat.formats`);
- ``step(reply) -> Step``: the policy's turn as text (decoded from the ids it
  generated); returns the observation (messages appended to the conversation as token
  ids), the reward of that turn and whether the episode is done.

An environment that also declares tools (``tools() -> list[Tool]``, the :class:`HasTools`
capability) has them rendered into the first messages (the chat template's ``tools``, or
a plain listing). How a tool call is written and run is the environment's business;
:mod:`stages.envs.tools` has the parser and the sandboxed Python tool the shipped
environments use.

A trajectory's reward is the sum of its turns' rewards (each kept on its policy turn);
none at all leaves the row unscored for a Verify stage. Errors raised by ``reset`` or
``step``, and calls that take longer than the stage's timeout, end the episode (its
``episode_end`` column) and are recorded in ``score_error``; the run goes on.

This is the interface of verifiers/SkyRL/rLLM-style environments (``reset``/``step``
over messages), kept in text so a user environment needs no tokenizer: turning text into
ids is gfcr's job, done without re-tokenizing (Kim et al. 2025's retokenization drift,
TRL #5224, verl #6921).

>>> class Echo:
...     def reset(self, task): return [Message("user", task["prompt"])]
...     def step(self, reply): return Step([Message("user", "again")], reward=1.0, done=True)
>>> isinstance(Echo(), Environment)
True
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Protocol, TypeVar, runtime_checkable

Role = Literal["system", "user", "assistant", "tool"]

EPISODE_ENDS = ("done", "turn_limit", "token_limit", "length", "env_error", "env_timeout")
"""Why an episode ended (the ``episode_end`` column): the environment said done; the
stage's turn or token cap; the policy's turn hit its token cap with no room for another
(``length``); the environment raised or exceeded its time."""


@dataclass(frozen=True)
class Message:
    """One chat message: ``role``, its text; ``name`` names the tool a tool message
    answers (null otherwise)."""

    role: Role
    content: str
    name: str | None = None

    def as_dict(self) -> dict[str, str]:
        """The OpenAI/transformers form, ``{"role": ..., "content": ...}``."""
        out = {"role": self.role, "content": self.content}
        if self.name is not None:
            out["name"] = self.name
        return out


@dataclass(frozen=True)
class Tool:
    """A tool the policy may call: its name, what it does, and its arguments as a JSON
    schema (an ``object`` schema, as in OpenAI's and transformers' tool definitions)."""

    name: str
    description: str
    parameters: dict[str, Any] = field(default_factory=lambda: {"type": "object",
                                                                 "properties": {}})

    def as_dict(self) -> dict[str, Any]:
        """The OpenAI function-tool form that chat templates render."""
        return {"type": "function", "function": {
            "name": self.name, "description": self.description, "parameters": self.parameters}}


@dataclass(frozen=True)
class Step:
    """The environment's answer to one policy turn.

    ``messages``: the observation, appended to the conversation (may be empty when
    ``done``); ``reward``: the reward of the turn just taken (None: none); ``done``:
    the episode is over. ``tool_name``/``tool_error``: when the observation is a tool's
    output, which tool ran and the error it ended with (a timeout, an exception, a call
    that did not parse), recorded on the observation's turn."""

    messages: list[Message] = field(default_factory=list)
    reward: float | None = None
    done: bool = False
    tool_name: str | None = None
    tool_error: str | None = None


@runtime_checkable
class Environment(Protocol):
    """One episode's environment (see the module docstring)."""

    def reset(self, task: dict[str, Any]) -> list[Message]: ...

    def step(self, reply: str) -> Step: ...


@runtime_checkable
class HasTools(Protocol):
    """An environment that declares tools the policy may call."""

    def tools(self) -> list[Tool]: ...


ENVIRONMENTS: dict[str, Callable[..., Environment]] = {}
"""Registered environments by name (:func:`register_env`)."""

E = TypeVar("E")


def register_env(name: str) -> Callable[[E], E]:
    """Register an environment class under ``name`` so a stage can name it."""
    def wrap(cls: E) -> E:
        have = ENVIRONMENTS.get(name)
        if have is not None and have is not cls:
            raise ValueError(f"environment {name!r} is already registered by {have!r}")
        ENVIRONMENTS[name] = cls  # type: ignore[assignment]
        return cls
    return wrap


def resolve_env(ref: str) -> Callable[..., Environment]:
    """The environment class ``ref`` names: a registered name, or ``"module:Class"``."""
    if ":" not in ref:
        if ref not in ENVIRONMENTS:
            raise ValueError(f"environment {ref!r} is not registered (known: "
                             f"{sorted(ENVIRONMENTS)}); name a registered one or give "
                             f"'module:Class'")
        return ENVIRONMENTS[ref]
    module, _, attr = ref.partition(":")
    try:
        found = getattr(importlib.import_module(module), attr)  # getattr: a user's name
    except (ImportError, AttributeError) as err:
        raise ValueError(f"environment {ref!r}: cannot load {attr!r} from module "
                         f"{module!r}: {err}") from err
    if not callable(found):
        raise ValueError(f"environment {ref!r} is not a class or factory")
    return found


@dataclass(frozen=True)
class EnvEntry:
    """One environment ``gfcr envs`` lists: where it comes from, its name, how a pipeline
    uses it, and what it is."""

    source: str
    name: str
    usage: str
    summary: str = ""


CATALOGUES: dict[str, Callable[[], list[EnvEntry]]] = {}
"""Listers of environments beyond the registered ones (installed packages, game
registries), by source; an operator library adds its own (:func:`register_catalogue`)."""


def register_catalogue(source: str, lister: Callable[[], list[EnvEntry]]) -> None:
    """Register ``lister`` as the catalogue of environments from ``source``."""
    CATALOGUES[source] = lister
