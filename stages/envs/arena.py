"""TextArena games (Guertler et al. 2025, "TextArena") as multi-turn environments.

A game from TextArena's registry (``textarena`` 0.7.4: 700+ ids, e.g. ``GuessTheNumber-v0``,
``Wordle-v0``, ``TicTacToe-v0``; ``gfcr envs`` lists them) runs offline in the process.
The policy is player 0. Each episode resets the game with a seed from its task row
(:func:`stages.envs.gym.task_seed`: a GRPO group plays one instance); the game's prompt is
the first user message, and after each reply the game's new messages (its own and the
opponent's moves, not the policy's echoed back) are the next one. The game's reward for
player 0 when it ends (``env.close()``) is the last turn's reward: a win, a loss, a draw,
or the game's own partial credit (GuessTheNumber's "percentage completion").

The game's action wrappers (TextArena's default for the id: wrapping a bare move in
brackets) apply; its observation wrappers do not, since gfcr keeps the conversation
itself. Two-player games need an opponent: a fixed move (``opponent_reply``) or a
function ``"module:function"`` from the opponent's observation (text) to its move.

A game id that does not exist is refused when the stage is built, naming the id and the
ids closest to it; so is a game that cannot be made here (one needing NLTK data that is
not installed, ``Wordle-v0``'s word list) or that does not take ``players`` players.
"""

from __future__ import annotations

import difflib
import functools
import importlib
import json
from typing import Any, Callable

from pydantic import Field, model_validator

from gfcr.core.environment import register_env
from gfcr.core.spec import Spec
from stages.envs.gym import TextEnvAdapter, load_ref

INSTALL = "pip install textarena==0.7.4 (or pip install -e '.[envs]')"
"""How to install the TextArena package (the ``envs`` extra pins it)."""


def registry() -> dict[str, Any]:
    """TextArena's game registry (id -> spec); an error names the install command."""
    try:
        from textarena.envs.registration import ENV_REGISTRY
    except ImportError as err:
        raise ValueError(f"textarena is not installed ({err}); {INSTALL}") from err
    return dict(ENV_REGISTRY)


def games() -> list[str]:
    """Every TextArena game id, sorted."""
    return sorted(registry())


def close_matches(game: str, ids: list[str]) -> list[str]:
    """The ids nearest ``game`` (case-insensitive), best first."""
    lower = {i.lower(): i for i in ids}
    found = difflib.get_close_matches(game.lower(), list(lower), n=5, cutoff=0.5)
    return [lower[f] for f in found]


def make_game(game: str, options: dict[str, Any]) -> Any:
    """A fresh game: its entry point with the id's and ``options`` keyword arguments,
    wrapped in the id's action wrappers only."""
    import textarena as ta

    spec = registry()[game]
    entry = spec.entry_point
    if isinstance(entry, str):
        module, _, name = entry.partition(":")
        entry = getattr(importlib.import_module(module), name)  # getattr: TextArena's id
    env = entry(**{**spec.kwargs, **options})
    for wrapper in spec.default_wrappers or []:
        if issubclass(wrapper, ta.ActionWrapper):
            env = wrapper(env)
    return env


class ArenaGame:
    """A TextArena game as a Gymnasium-style text environment (:mod:`stages.envs.gym`),
    player 0 against an optional scripted opponent."""

    def __init__(self, game: str, players: int, options: dict[str, Any],
                 opponent: Callable[[str], str] | None) -> None:
        self.env = make_game(game, options)
        self.players, self.opponent = players, opponent

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
              ) -> tuple[str, dict[str, Any]]:
        self.env.reset(num_players=self.players, seed=seed)
        done = self._opponents()
        return self._observe(), {"done": done}

    def step(self, action: str) -> tuple[str, float | None, bool, bool, dict[str, Any]]:
        done, info = self.env.step(action)
        done = done or self._opponents()
        if done:
            rewards, _ = self.env.close()
            reward = (rewards or {}).get(0)
            return "", None if reward is None else float(reward), True, False, dict(info or {})
        return self._observe(), 0.0, False, False, dict(info or {})

    def _opponents(self) -> bool:
        """The opponent's moves until it is player 0's turn; whether the game ended."""
        done = False
        while not done and self.env.state.current_player_id != 0:
            if self.opponent is None:
                raise RuntimeError("the game gave the turn to player "
                                   f"{self.env.state.current_player_id} and there is no "
                                   "opponent")
            _, obs = self.env.get_observation()
            done, _ = self.env.step(self.opponent(render(obs, self.env.state.current_player_id)))
        return done

    def _observe(self) -> str:
        _, obs = self.env.get_observation()
        return render(obs, 0)


def render(obs: Any, player: int) -> str:
    """A player's new observations as text: the game's messages and the other players'
    moves (``[GAME] ...``, ``[Player 1] ...``), not the player's own moves."""
    if isinstance(obs, str):
        return obs
    lines = []
    for sender, text, kind in obs or []:
        if sender == player and getattr(kind, "name", "") == "PLAYER_ACTION":
            continue
        lines.append(f"[GAME] {text}" if sender == -1 else f"[Player {sender}] {text}")
    return "\n".join(lines).strip()


class ArenaOptions(Spec):
    """Options of the ``textarena`` environment."""

    game: str
    """A TextArena game id (``gfcr envs`` lists them), e.g. ``GuessTheNumber-v0``."""
    players: int = Field(1, ge=1, le=2)
    """Players of the game; the policy is player 0, the other one the opponent."""
    opponent: str | None = None
    """Two-player games: ``"module:function"``, the opponent's move from its observation."""
    opponent_reply: str | None = None
    """Two-player games: the opponent's fixed move (instead of ``opponent``)."""
    game_options: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments of the game (e.g. ``{"max_number": 10}``), over the id's."""
    system: str | None = None
    """A system message before the game's prompt."""

    @model_validator(mode="after")
    def _playable(self) -> "ArenaOptions":
        ids = registry()
        if self.game not in ids:
            near = close_matches(self.game, list(ids))
            raise ValueError(f"TextArena has no game {self.game!r}" + (
                f"; did you mean {', '.join(repr(n) for n in near)}?" if near else
                "; `gfcr envs` lists the games"))
        if self.opponent is not None and self.opponent_reply is not None:
            raise ValueError("give opponent or opponent_reply, not both")
        if self.opponent is not None:
            load_ref(self.opponent, "opponent")
        if self.players > 1 and self.opponent is None and self.opponent_reply is None:
            raise ValueError(f"{self.game!r} with {self.players} players needs an opponent "
                             "(opponent='module:function' or opponent_reply='...')")
        _trial(self.game, self.players, json.dumps(self.game_options, sort_keys=True))
        return self

    def opponent_fn(self) -> Callable[[str], str] | None:
        if self.opponent is not None:
            fn: Callable[[str], str] = load_ref(self.opponent, "opponent")
            return fn
        reply = self.opponent_reply
        return None if reply is None else (lambda _obs: reply)


@functools.lru_cache(maxsize=64)
def _trial(game: str, players: int, options: str) -> None:
    """Make and reset the game once (cached): a game that cannot run here fails at build."""
    try:
        make_game(game, json.loads(options)).reset(num_players=players, seed=0)
    except LookupError as err:  # NLTK's missing-data error
        said = [line.strip() for line in str(err).splitlines() if line.strip(" *")]
        raise ValueError(f"TextArena game {game!r} needs data that is not installed here "
                         f"({' '.join(said[:2])})") from None
    except Exception as err:  # noqa: BLE001 - the game's own error, named
        raise ValueError(f"TextArena game {game!r} cannot be made and reset with "
                         f"{players} player(s) and options {options}: "
                         f"{type(err).__name__}: {err}") from None


@register_env("textarena")
def textarena(**options: Any) -> TextEnvAdapter:
    """A TextArena game, player 0 the policy (:class:`ArenaOptions`)."""
    spec = ArenaOptions(**options)
    game = ArenaGame(spec.game, spec.players, spec.game_options, spec.opponent_fn())
    return TextEnvAdapter(game, system=spec.system)
