"""Multi-turn episodes on real engines: token-exact trajectories (byte tokenizer and a
trained BPE tokenizer with a chat template), one batched engine call per turn-wave,
turn and token limits, and environments that raise or hang."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from gfcr.core.environment import Message, Step
from gfcr.core.rollout import EPISODE_END, PROMPT_SCHEMA, TURN_COUNT, col, conform, prompt_id
from gfcr.core.trajectory import loss_mask
from stages import HF, TinyLlama
from stages.generate.episodes import Episodes
from tests.resources.chat import Recording, chat_policy
from tests.resources.rollouts import context

QUESTIONS = [("1+2=", "3"), ("4+4=", "8"), ("9-5=", "4")]


def plan(questions: list[tuple[str, str]] = QUESTIONS) -> pa.Table:
    rows = [{"prompt_id": prompt_id("t", q), "task": "t", "prompt": q, "answer": a,
             "meta": None} for q, a in questions]
    return pa.Table.from_pylist(rows, schema=PROMPT_SCHEMA)


def byte_engine() -> Recording:
    return Recording(HF(device="cpu").build(TinyLlama().build(seed=0), seed=0))


def bpe_engine() -> Recording:
    return Recording(HF(device="cpu").build(chat_policy(seed=0), seed=0))


def check_token_exact(table: pa.Table, engine: Recording, temperature: float = 1.0,
                      atol: float = 2e-4) -> None:
    """Every stored policy turn is the ids and logprobs the engine returned for that
    episode, each request's prompt is the trajectory so far, and the logprobs match a
    teacher-forced pass over the stored sequence."""
    rows = table.to_pylist()
    seen: dict[int, int] = {}  # row -> policy turns matched so far
    for requests, outputs in engine.calls:
        live = [i for i, r in enumerate(rows) if seen.get(i, 0) < r[TURN_COUNT]]
        assert len(requests) == len(live)  # one batched call for every live episode
        for i, req, out in zip(live, requests, outputs):
            turns = rows[i][col.TURNS]
            k = [j for j, t in enumerate(turns) if t["source"] == "policy"][seen.get(i, 0)]
            assert req.prompt_ids == [x for t in turns[:k] for x in t["token_ids"]]
            assert turns[k]["token_ids"] == out.completion_ids
            assert turns[k]["logprobs"] == pytest.approx(out.logprobs, abs=1e-6)
            seen[i] = seen.get(i, 0) + 1
    for r in rows:
        assert seen.get(rows.index(r), 0) == r[TURN_COUNT]
        mask = np.array(loss_mask(r[col.TURNS]))
        assert len(mask) == len(r[col.COMPLETION_IDS]) == len(r[col.LOGPROBS])
        if not mask.any():
            continue
        forced = np.array(engine.forced_logprobs(r[col.PROMPT_IDS], r[col.COMPLETION_IDS],
                                                 temperature))
        assert np.allclose(forced[mask], np.array(r[col.LOGPROBS])[mask], atol=atol)
        assert not np.array(r[col.LOGPROBS])[~mask].any()  # observation tokens: 0
    conform(table)  # the flat columns and turns fit the rollout schema


@pytest.mark.parametrize("make", [byte_engine, bpe_engine], ids=["byte", "bpe-chat"])
def test_feedback_episodes_are_token_exact_over_several_turns(make: Any) -> None:
    engine = make()
    stage = Episodes(env="feedback", env_options={"max_tries": 3, "hint": "answer"}, n=3,
                     max_turns=3, max_tokens=4)
    table = stage.generate(context(), plan(), engine, None)
    assert table.num_rows == 9 and len(engine.calls) <= 3
    assert max(table.column(TURN_COUNT).to_pylist()) == 3  # an untrained policy: 3 tries
    check_token_exact(table, engine)
    for r in table.to_pylist():
        sources = [t["source"] for t in r[col.TURNS]]
        assert sources[0] == "environment" and sources[1] == "policy"
        assert sources.count("policy") == r[TURN_COUNT]
        assert r[EPISODE_END] in ("done", "turn_limit")
        assert r[col.REWARD] in (0.0, 1.0)


def test_a_turn_cut_by_its_token_cap_is_closed_by_the_next_observation() -> None:
    engine = bpe_engine()
    stage = Episodes(env="feedback", env_options={"max_tries": 2}, n=2, max_turns=2,
                     max_tokens=2, temperature=1.0)
    table = stage.generate(context(), plan(), engine, None)
    eos = engine.policy.tokenizer.eos_token_id
    cut = 0
    for r in table.to_pylist():
        turns = r[col.TURNS]
        for before, after in zip(turns[1:], turns[2:]):
            if before["source"] == "policy" and before["token_ids"][-1] != eos:
                assert after["token_ids"][0] == eos  # the template's end of turn, masked
                cut += 1
    assert cut > 0
    check_token_exact(table, engine)


def test_turn_and_token_limits_end_episodes_with_their_reason() -> None:
    engine = byte_engine()
    turns = Episodes(env="guess", env_options={"low": 1, "high": 1000}, n=2, max_turns=2,
                     max_tokens=3).generate(context(), plan(), engine, None)
    assert set(turns.column(EPISODE_END).to_pylist()) <= {"turn_limit", "done"}
    assert "turn_limit" in turns.column(EPISODE_END).to_pylist()
    tokens = Episodes(env="guess", env_options={"low": 1, "high": 1000}, n=2, max_turns=5,
                      max_tokens=3, max_episode_tokens=12).generate(context(), plan(), engine,
                                                                    None)
    ends = tokens.column(EPISODE_END).to_pylist()
    assert "token_limit" in ends
    for r in tokens.to_pylist():
        assert len(r[col.COMPLETION_IDS]) <= 12
        if r[EPISODE_END] == "token_limit":
            assert r[col.TURNS][-1]["source"] == "policy"


class Flaky:
    """Raises on the question "4+4=", hangs on "9-5=", answers "done" otherwise."""

    release = threading.Event()

    def reset(self, task: dict[str, Any]) -> list[Message]:
        self.q = task["prompt"]
        return [Message("user", self.q)]

    def step(self, reply: str) -> Step:
        if self.q == "4+4=":
            raise ZeroDivisionError("the environment divided by zero")
        if self.q == "9-5=":
            self.release.wait()  # hangs until the test ends
        return Step(reward=0.5, done=True)


class BrokenReset:
    def __init__(self, fail: bool = True) -> None:
        self.fail = fail

    def reset(self, task: dict[str, Any]) -> list[Message]:
        raise RuntimeError("no episode for you")

    def step(self, reply: str) -> Step:
        return Step(done=True)


def test_an_environment_that_raises_or_hangs_is_recorded_and_the_others_go_on() -> None:
    engine = byte_engine()
    stage = Episodes(env=f"{__name__}:Flaky", n=2, max_turns=2, max_tokens=3, env_timeout=2.0)
    try:
        table = stage.generate(context(), plan(), engine, None)
    finally:
        Flaky.release.set()
    by_q = {q: [r for r in table.to_pylist() if r[col.PROMPT] == q] for q, _ in QUESTIONS}
    assert [r[EPISODE_END] for r in by_q["1+2="]] == ["done", "done"]
    assert [r[col.REWARD] for r in by_q["1+2="]] == [0.5, 0.5]
    for r in by_q["4+4="]:
        assert r[EPISODE_END] == "env_error" and r[col.REWARD] == 0.0
        assert "ZeroDivisionError: the environment divided by zero" in r[col.SCORE_ERROR]
    for r in by_q["9-5="]:
        assert r[EPISODE_END] == "env_timeout" and r[col.SCORE_ERROR].startswith("EnvTimeout")
        assert r[TURN_COUNT] == 1  # its policy turn is kept
    broken = Episodes(env=f"{__name__}:BrokenReset", n=1, max_turns=2).generate(
        context(), plan(), engine, None)
    assert set(broken.column(EPISODE_END).to_pylist()) == {"env_error"}
    assert all("no episode for you" in e for e in broken.column(col.SCORE_ERROR).to_pylist())
    assert broken.column(col.COMPLETION_IDS).to_pylist() == [[], [], []]


def test_an_unknown_environment_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match="environment 'nope' is not registered"):
        Episodes(env="nope")
    with pytest.raises(ValueError, match="cannot load 'Nope' from module"):
        Episodes(env=f"{__name__}:Nope")


def test_an_in_flight_control_stage_beside_episodes_is_refused() -> None:
    from gfcr import PipelineError
    from stages import GRPO, OnlinePrune, UniformSampler
    from tests.conftest import tiny_pipeline

    with pytest.raises(PipelineError, match="cannot act on multi-turn episodes"):
        tiny_pipeline(stages=[UniformSampler(batch=2), OnlinePrune(),
                              Episodes(env="feedback", n=2), GRPO()])


class Garbage:
    """Answers "1+2=" with observations that are not messages, resets "4+4=" with a
    string for messages, and plays "9-5=" properly (feedback until the turn limit)."""

    def reset(self, task: dict[str, Any]) -> Any:
        self.q = task["prompt"]
        return "not a list of messages" if self.q == "4+4=" else [Message("user", self.q)]

    def step(self, reply: str) -> Any:
        if self.q == "1+2=":
            return Step(["just a string"])  # type: ignore[list-item]
        return Step([Message("user", "again")], reward=0.0)


def test_an_environment_answer_that_cannot_be_appended_is_recorded() -> None:
    table = Episodes(env=f"{__name__}:Garbage", n=1, max_turns=2, max_tokens=3).generate(
        context(), plan(), byte_engine(), None)
    rows = {r[col.PROMPT]: r for r in table.to_pylist()}
    assert rows["1+2="][EPISODE_END] == "env_error" and rows["1+2="][TURN_COUNT] == 1
    assert "step returned what cannot be appended" in rows["1+2="][col.SCORE_ERROR]
    assert rows["4+4="][EPISODE_END] == "env_error" and rows["4+4="][TURN_COUNT] == 0
    assert "reset returned" in rows["4+4="][col.SCORE_ERROR]
    assert rows["9-5="][EPISODE_END] == "turn_limit" and rows["9-5="][col.SCORE_ERROR] is None
