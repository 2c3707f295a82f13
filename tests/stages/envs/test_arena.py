"""TextArena games (the real ``textarena`` package) as environments: two pipeline steps end
to end on the HF engine and on vLLM, episodes token-exact against a teacher-forced pass,
the reward the game's own, a two-player game against a scripted opponent, and a game id
that does not exist refused at build with the ids closest to it."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("textarena", reason="the envs extra: pip install -e '.[envs]'")

from gfcr import Pipeline  # noqa: E402
from gfcr.core.pipeline import PipelineError  # noqa: E402
from gfcr.core.rollout import EPISODE_END, col  # noqa: E402
from gfcr.launch.run import execute  # noqa: E402
from stages import GRPO, TextArenaEnv, UniformSampler  # noqa: E402
from stages.envs.arena import make_game  # noqa: E402
from store import RolloutStore  # noqa: E402
from tests.resources.rollouts import context  # noqa: E402
from tests.resources.vllm import VLLM_POLICY, LLMPool, vllm_engine_spec  # noqa: E402
from tests.resources.vllm import llm_pool  # noqa: E402, F401 (the fixture)
from tests.stages.generate.test_episodes import bpe_engine, check_token_exact, plan  # noqa: E402

GAME = {"game": "GuessTheNumber-v0", "game_options": {"max_number": 8, "max_turns": 2}}
"""A short game: a number in 1..8, two guesses (the game's reward: 1 for the number, else
its partial credit for the last guess)."""


def stage(**over: Any) -> Any:
    return TextArenaEnv(**{**GAME, "n": 2, "max_turns": 2, "max_tokens": 4,
                           "max_episode_tokens": 200, **over})


def replay(row: dict[str, Any], decode: Any) -> float:
    """The game's own reward for the row's replies, on a fresh game with the same seed."""
    from stages.envs.gym import task_seed

    game = make_game(GAME["game"], GAME["game_options"])
    game.reset(num_players=1, seed=task_seed({"prompt_id": row[col.PROMPT_ID]}))
    done = False
    for turn in row[col.TURNS]:
        if turn["source"] == "policy" and not done:
            done, _ = game.step(decode(turn["token_ids"]))
    rewards, _ = game.close()
    return float((rewards or {}).get(0, 0.0)) if done else 0.0


def test_textarena_episodes_are_token_exact_and_rewarded_by_the_game() -> None:
    engine = bpe_engine()
    table = stage(n=3).generate(context(), plan(), engine, None)
    check_token_exact(table, engine)
    rows = table.to_pylist()
    assert len(rows) == 9 and all(r[col.SCORE_ERROR] is None for r in rows)
    assert all(r[EPISODE_END] == "done" for r in rows)  # the game ends within its 2 guesses
    for r in rows:
        assert r[col.REWARD] == pytest.approx(replay(r, engine.decode))
    first = engine.decode(rows[0][col.TURNS][0]["token_ids"])
    assert "Guess The Number" in first and "between 1 and 8" in first


def test_a_two_player_game_against_a_scripted_opponent() -> None:
    s = TextArenaEnv(game="TicTacToe-v0", players=2, opponent_reply="[4]", n=1, max_turns=2,
                     max_tokens=4, max_episode_tokens=600)
    rows = s.generate(context(), plan(), bpe_engine(), None).to_pylist()
    assert len(rows) == 3
    for r in rows:  # an untrained policy's move is invalid: the game ends, a loss for it
        assert r[col.SCORE_ERROR] is None and r[EPISODE_END] in ("done", "turn_limit")
        assert r[col.REWARD] in (-1.0, 0.0, 1.0)


def test_a_game_id_that_does_not_exist_is_refused_at_build_with_close_matches() -> None:
    with pytest.raises(ValueError, match=r"no game 'GuessTheNumbr-v0'.*'GuessTheNumber-v0'"):
        TextArenaEnv(game="GuessTheNumbr-v0")
    with pytest.raises(ValueError, match="needs an opponent"):
        TextArenaEnv(game="TicTacToe-v0", players=2)
    with pytest.raises(ValueError, match="number of players has to be 2"):
        TextArenaEnv(game="TicTacToe-v0")



def test_a_pipeline_file_naming_a_missing_game_fails_to_load_naming_it(tmp_path: Any) -> None:
    from gfcr.core.loading import load

    path = tmp_path / "bad_game.py"
    path.write_text(PIPELINE_FILE)
    with pytest.raises(PipelineError) as err:
        load(str(path))
    assert "bad_game.py" in str(err.value) and "no game 'GuessTheNumbr-v0'" in str(err.value)
    assert "'GuessTheNumber-v0'" in str(err.value)  # the closest id


PIPELINE_FILE = '''
from gfcr import Pipeline
from stages import GRPO, HF, ReasoningGym, TextArenaEnv, TinyLlama, UniformSampler

pipeline = Pipeline(name="bad-game", steps=1, task=ReasoningGym(train_size=8, heldout_size=4),
                    policy=TinyLlama(), engine=HF(device="cpu"),
                    stages=[UniformSampler(batch=2), TextArenaEnv(game="GuessTheNumbr-v0"),
                            GRPO()])
'''


def _small() -> dict[str, Any]:
    from tests.pipelines.test_pipelines import _shrunk
    from pipelines.agentic import pipeline as agentic

    data = _shrunk(agentic).to_dict()
    return {k: data[k] for k in ("task", "policy", "engine", "evaluation")}


def _pipeline(**engine: Any) -> Pipeline:
    return Pipeline(name="arena", steps=2, **{**_small(), **engine},
                    stages=[UniformSampler(batch=2), stage(max_episode_tokens=1000), GRPO()])


def _check_store(root: Any, run_id: str) -> None:
    with RolloutStore.open(root / "store", read_only=True) as s:
        rows = s.sql(f"SELECT step, turns, episode_end, reward, score_error, consumed_at_step "
                     f"FROM rollouts WHERE run_id = '{run_id}'").to_pylist()
    assert {r["step"] for r in rows} == {0, 1} and len(rows) == 2 * 2 * 2
    for r in rows:
        assert r["score_error"] is None and r["episode_end"] in ("done", "turn_limit")
        assert r["reward"] is not None and 0.0 <= r["reward"] <= 1.0
        assert r["consumed_at_step"] == r["step"]
        assert [t["source"] for t in r["turns"]][:2] == ["environment", "policy"]


def test_a_textarena_game_runs_two_steps_end_to_end_on_hf(tmp_path: Any) -> None:
    summary = execute(_pipeline(), root=tmp_path, executor="local", run_id="arena-hf")
    assert summary.steps == 2
    _check_store(tmp_path, "arena-hf")


def test_a_textarena_game_runs_two_steps_end_to_end_on_vllm(tmp_path: Any,
                                                             llm_pool: LLMPool) -> None:
    # the game's prompt is ~500 bytes: a context longer than the pooled policy's 256
    policy = VLLM_POLICY.model_copy(update={"max_position": 2048})
    p = _pipeline(policy=policy, engine=vllm_engine_spec())
    try:
        summary = execute(p, root=tmp_path, executor="local", run_id="arena-vllm")
    finally:
        llm_pool.release()
    assert summary.steps == 2
    _check_store(tmp_path, "arena-vllm")
