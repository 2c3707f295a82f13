"""Environments from the ecosystem as pipeline stages: each returns an
:class:`~stages.generate.episodes.Episodes` stage running the environment, its options
checked now (a game id that does not exist, a factory that does not load, a URL that is
not http fails when the pipeline is built, naming what was wrong).

- ``TextArenaEnv(game="GuessTheNumber-v0", n=8, max_turns=6)``: a TextArena game
  (:mod:`stages.envs.arena`);
- ``GymEnv(factory="mymodule:make_env", n=8)``: any Gymnasium-style text environment
  (:mod:`stages.envs.gym`);
- ``RemoteEnv(url="http://127.0.0.1:8000", n=8)``: an OpenEnv-style server over HTTP
  (:mod:`stages.envs.remote`).

Every other keyword is the Episodes stage's (``n``, ``max_turns``, ``max_tokens``,
``temperature``, ``env_timeout``, ...). The stage stored with the run is that Episodes
stage (``env="textarena"`` and its ``env_options``), so a YAML pipeline can name it the
same way.

>>> RemoteEnv(url="http://127.0.0.1:8000", n=2).env_options["url"]
'http://127.0.0.1:8000'
"""

from __future__ import annotations

from typing import Any

from stages.envs.arena import ArenaOptions
from stages.envs.gym import GymOptions
from stages.envs.remote import RemoteOptions
from stages.generate.episodes import Episodes


def TextArenaEnv(game: str, *, players: int = 1, opponent: str | None = None,  # noqa: N802
                 opponent_reply: str | None = None, game_options: dict[str, Any] | None = None,
                 system: str | None = None, **episodes: Any) -> Episodes:
    """An Episodes stage playing the TextArena game ``game`` (ids: ``gfcr envs``)."""
    spec = ArenaOptions(game=game, players=players, opponent=opponent,
                        opponent_reply=opponent_reply, game_options=game_options or {},
                        system=system)
    return Episodes(env="textarena", env_options=spec.model_dump(exclude_defaults=True),
                    **episodes)


def GymEnv(factory: str, *, options: dict[str, Any] | None = None,  # noqa: N802
           system: str | None = None, task_options: bool = False, **episodes: Any
           ) -> Episodes:
    """An Episodes stage running the Gymnasium-style text environment ``factory`` makes."""
    spec = GymOptions(factory=factory, options=options or {}, system=system,
                      task_options=task_options)
    return Episodes(env="gym", env_options=spec.model_dump(exclude_defaults=True),
                    **episodes)


def RemoteEnv(url: str, *, timeout: float = 10.0, max_bytes: int = 1 << 20,  # noqa: N802
              action_key: str = "message", observation_key: str = "prompt",
              system: str | None = None, **episodes: Any) -> Episodes:
    """An Episodes stage against the OpenEnv-style server at ``url``; the stage's
    ``env_timeout`` defaults to a little more than ``timeout`` (the client's own
    deadline ends a hung call first, with its reason)."""
    spec = RemoteOptions(url=url, timeout=timeout, max_bytes=max_bytes,
                         action_key=action_key, observation_key=observation_key,
                         system=system)
    episodes.setdefault("env_timeout", timeout + 5.0)
    return Episodes(env="remote", env_options=spec.model_dump(exclude_defaults=True),
                    **episodes)
