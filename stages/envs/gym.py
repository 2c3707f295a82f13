"""Gymnasium-style text environments as gfcr environments.

A Gymnasium-style text environment (skyrl-gym, GEM, reasoning-gym's games, TextArena
through :mod:`stages.envs.arena`, an OpenEnv server through :mod:`stages.envs.remote`) is
an object with

- ``reset(seed=None, options=None) -> (observation, info)``, and
- ``step(action) -> (observation, reward, terminated, truncated, info)`` (Gymnasium's
  five-tuple; the older four-tuple ``(observation, reward, done, info)`` is read too),

where the observation and the action are text (Towers et al. 2024, "Gymnasium"). The
:class:`TextEnvAdapter` turns one into a gfcr environment (:mod:`gfcr.core.environment`):
the reset observation is the episode's first user message (after an optional system
message), each policy reply is the action, each later observation a user message, the
step's reward that turn's reward, and ``terminated or truncated`` ends the episode.

The environment is reset with a seed drawn from the task row (its ``prompt_id``, else its
prompt), so the ``n`` episodes of one task (a GRPO group) play the same instance and
different tasks play different ones; the task's prompt itself is not shown unless the
environment uses ``options["task"]`` (``task_options``).

The ``gym`` environment (``Episodes(env="gym", env_options={"factory": "mod:make"})``, or
:func:`stages.generate.env_stages.GymEnv`) makes one object per episode from a factory named
``"module:attribute"``: a class or function (called with ``options``), or an object with
``reset`` and ``step`` (deep-copied for every episode, so episodes never share state).

>>> class Count:
...     def reset(self, seed=None, options=None): self.n = 0; return "say a word", {}
...     def step(self, action):
...         self.n += 1
...         return f"heard {action!r}", 1.0, self.n == 2, False, {}
>>> env = TextEnvAdapter(Count())
>>> [m.content for m in env.reset({"prompt": "p"})]
['say a word']
>>> env.step("hi").messages[0].content, env.step("yo").done
("heard 'hi'", True)
"""

from __future__ import annotations

import copy
import hashlib
import importlib
import math
from typing import Any, Callable, Protocol, runtime_checkable

from pydantic import Field, field_validator

from gfcr.core.environment import Message, Step, register_env
from gfcr.core.spec import Spec


@runtime_checkable
class TextEnv(Protocol):
    """A Gymnasium-style environment with text observations and actions."""

    def reset(self, *, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]: ...

    def step(self, action: str) -> tuple[Any, ...]: ...


def task_seed(task: dict[str, Any]) -> int:
    """A seed in ``[0, 2**31)`` from a task row: the same task, the same seed."""
    key = str(task.get("prompt_id") or task.get("prompt") or "")
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:4], "big") >> 1


class TextEnvAdapter:
    """One episode of a Gymnasium-style text environment as a gfcr environment."""

    def __init__(self, env: Any, system: str | None = None, task_options: bool = False
                 ) -> None:
        missing = [m for m in ("reset", "step") if not callable(getattr(env, m, None))]
        if missing:
            raise TypeError(f"{type(env).__name__} is not a Gymnasium-style environment: it "
                            f"has no {' or '.join(missing)} method")
        self.env, self.system, self.task_options = env, system, task_options

    def reset(self, task: dict[str, Any]) -> list[Message]:
        options = ({"task": {k: v for k, v in task.items() if k != "row"}}
                   if self.task_options else None)
        result = self.env.reset(seed=task_seed(task), options=options)
        if not isinstance(result, tuple) or len(result) != 2:
            raise TypeError(f"reset returned {type(result).__name__}, not (observation, info)")
        first = [Message("user", _text(result[0], "reset"))]
        return ([Message("system", self.system)] if self.system else []) + first

    def step(self, reply: str) -> Step:
        result = self.env.step(reply)
        if not isinstance(result, tuple) or len(result) not in (4, 5):
            raise TypeError(f"step returned {type(result).__name__}, not (observation, "
                            "reward, terminated, truncated, info)")
        obs, reward = result[0], _reward(result[1])
        done = bool(result[2]) or (len(result) == 5 and bool(result[3]))
        if done:
            close = getattr(self.env, "close", None)
            if callable(close):
                close()
            return Step(reward=reward, done=True)
        return Step([Message("user", _text(obs, "step"))], reward=reward)


def _text(obs: Any, call: str) -> str:
    if not isinstance(obs, str):
        raise TypeError(f"{call} returned a {type(obs).__name__} observation; a text "
                        "environment's observations are str")
    return obs


def _reward(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(float(value)):
        raise ValueError(f"reward {value!r} is not a finite number")
    return float(value)


def load_ref(ref: str, what: str) -> Any:
    """The attribute ``"module:attribute"`` names (an error names ``what`` and the ref)."""
    module, colon, attr = ref.partition(":")
    if not colon or not module or not attr:
        raise ValueError(f"{what} {ref!r} is not 'module:attribute'")
    try:
        return getattr(importlib.import_module(module), attr)  # getattr: a user's name
    except (ImportError, AttributeError) as err:
        raise ValueError(f"{what} {ref!r}: cannot load {attr!r} from module {module!r}: "
                         f"{err}") from err


class GymOptions(Spec):
    """Options of the ``gym`` environment."""

    factory: str
    """``"module:attribute"``: a class or function making the environment (called with
    ``options``), or an environment object (deep-copied for every episode)."""
    options: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments of the factory."""
    system: str | None = None
    """A system message before the first observation."""
    task_options: bool = False
    """Pass the task row to ``reset`` as ``options={"task": {...}}``."""

    @field_validator("factory")
    @classmethod
    def _loads(cls, value: str) -> str:
        found = load_ref(value, "factory")
        if not callable(found) and not isinstance(found, TextEnv):
            raise ValueError(f"factory {value!r} is neither callable nor an object with "
                             "reset and step")
        return value

    def make(self) -> Any:
        found = load_ref(self.factory, "factory")
        if not isinstance(found, type) and isinstance(found, TextEnv):
            return copy.deepcopy(found)  # an environment object: one copy per episode
        maker: Callable[..., Any] = found
        return maker(**self.options)


@register_env("gym")
def gym(**options: Any) -> TextEnvAdapter:
    """A Gymnasium-style text environment from a factory (:class:`GymOptions`)."""
    spec = GymOptions(**options)
    return TextEnvAdapter(spec.make(), system=spec.system, task_options=spec.task_options)
