"""The Gymnasium-style adapter: a small text environment written here (a class, a factory
function, an object, the older four-tuple) trains unchanged through GymEnv, on the
byte-level tiny policy, token-exact; bad factories and bad answers are named."""

from __future__ import annotations

from typing import Any

import pytest

from gfcr.core.environment import resolve_env
from gfcr.core.rollout import EPISODE_END, TURN_COUNT, col
from stages import GymEnv
from tests.resources.rollouts import context
from tests.stages.generate.test_episodes import byte_engine, check_token_exact, plan


class Countdown:
    """Say a number; the episode ends when the reply holds the letter the environment
    asks for, or after ``turns`` steps (truncated). Reward: 1 for the letter, 0.1 a step."""

    def __init__(self, turns: int = 3) -> None:
        self.turns, self.n, self.letter = turns, 0, "a"

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
              ) -> tuple[str, dict[str, Any]]:
        self.n, self.letter = 0, "abcdefgh"[(seed or 0) % 8]
        self.task = (options or {}).get("task")
        return f"say {self.letter}:", {"seed": seed}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        self.n += 1
        hit = self.letter in action
        return (f"not yet, say {self.letter}:", 1.0 if hit else 0.1, hit,
                self.n >= self.turns, {})


class OldStyle(Countdown):
    """The four-tuple of Gym before 0.26: (observation, reward, done, info)."""

    def step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:  # type: ignore[override]
        obs, reward, hit, cut, info = super().step(action)
        return obs, reward, hit or cut, info


def make_countdown(turns: int) -> Countdown:
    return Countdown(turns)


ONE = Countdown(2)
"""An environment object: each episode gets a copy."""


class Broken(Countdown):
    def step(self, action: str) -> tuple[Any, ...]:  # type: ignore[override]
        return ({"not": "text"}, 0.0, False, False, {})


HERE = __name__


@pytest.mark.parametrize("factory,options,turns", [
    (f"{HERE}:Countdown", {}, 3), (f"{HERE}:make_countdown", {"turns": 2}, 2),
    (f"{HERE}:ONE", {}, 2), (f"{HERE}:OldStyle", {"turns": 3}, 3)])
def test_a_gym_style_text_env_trains_unchanged_token_exact(factory: str, options: dict[str, Any],
                                                           turns: int) -> None:
    engine = byte_engine()
    stage = GymEnv(factory=factory, options=options, n=2, max_turns=4, max_tokens=3)
    table = stage.generate(context(), plan(), engine, None)
    check_token_exact(table, engine)
    rows = table.to_pylist()
    assert len(rows) == 6
    for r in rows:
        env = Countdown(turns)
        first, _ = env.reset(seed=_seed(r))
        assert first in _text(r[col.TURNS][0])
        replies = [_text(t) for t in r[col.TURNS] if t["source"] == "policy"]
        rewards = [env.step(a)[1] for a in replies]  # replayed on a fresh copy
        assert r[col.REWARD] == pytest.approx(sum(rewards))
        assert r[EPISODE_END] == "done" and r[TURN_COUNT] <= turns


def test_the_task_row_reaches_reset_when_asked_and_a_system_message_comes_first() -> None:
    env = resolve_env("gym")(factory=f"{HERE}:Countdown", task_options=True, system="be brief")
    messages = env.reset({"prompt": "1+2=", "prompt_id": "p", "row": {"big": 1}})
    assert [m.role for m in messages] == ["system", "user"]
    assert env.env.task == {"prompt": "1+2=", "prompt_id": "p"}


def test_a_non_text_observation_ends_its_episode_with_the_reason() -> None:
    stage = GymEnv(factory=f"{HERE}:Broken", n=1, max_turns=3, max_tokens=2)
    rows = stage.generate(context(), plan(), byte_engine(), None).to_pylist()
    assert all(r[EPISODE_END] == "env_error" and "dict observation" in r[col.SCORE_ERROR]
               for r in rows)


def test_a_factory_that_does_not_load_is_refused_at_build_naming_it() -> None:
    with pytest.raises(ValueError, match="no_such_module"):
        GymEnv(factory="no_such_module:make")
    with pytest.raises(ValueError, match="not 'module:attribute'"):
        GymEnv(factory="Countdown")
    with pytest.raises(ValueError, match="HERE"):
        GymEnv(factory=f"{HERE}:HERE")  # a string: neither callable nor an environment


def _seed(row: dict[str, Any]) -> int:
    from stages.envs.gym import task_seed

    return task_seed({"prompt_id": row[col.PROMPT_ID], "prompt": None})


def _text(turn: dict[str, Any]) -> str:
    from stages.engines.tokenizers import ByteTokenizer

    return ByteTokenizer().decode(turn["token_ids"])
