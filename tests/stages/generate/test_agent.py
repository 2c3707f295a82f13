"""AgentEnv: agents written against the real ``openai`` client, served by a real engine
through gfcr's endpoint; the trajectories are the engine's ids, turn by turn."""

from __future__ import annotations

from typing import Any

import httpx
import pyarrow as pa
import pytest

from gfcr.core.rollout import conform
from gfcr.core.trajectory import loss_mask
from stages import HF, AgentEnv, TinyLlama
from stages.generate.agent import AgentFailed
from stages.generate._episodes import Episode
from gfcr.chat.formats import chat_format
from stages.endpoint._openai_chat import OpenAIChat
from stages.generate._waves import Waves
from stages.generate.openai_api import AgentServer
from tests.resources import agents
from tests.resources.agents import Recording, needs_openai, plan
from tests.resources.chat import chat_policy
from tests.resources.rollouts import context

openai = needs_openai()

POLICY = TinyLlama(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64,
                   max_position=1024)  # the tool-using conversations pass 256 tokens
REF = "tests.resources.agents:"


def _engine(policy: Any = None) -> Recording:
    policy = policy or POLICY.build(seed=0)
    return Recording(HF(device="cpu").build(policy, seed=0))


def _run(agent: str, *prompts: str, engine: Recording | None = None, **fields: Any):
    engine = engine or _engine()
    agents.SEEN.clear()
    stage = AgentEnv(agent=REF + agent, **{"window": 5.0, **fields})
    out = conform(stage.generate(context(), plan(*prompts, answer="21"), engine, None))
    return out.to_pylist(), engine


@pytest.mark.parametrize("policy", ["byte", "bpe_chatml"])
def test_each_turn_holds_the_engines_ids_and_logprobs_equal_a_teacher_forced_pass(policy):
    built = POLICY.build(seed=0) if policy == "byte" else chat_policy(seed=0)
    rows, engine = _run("three_turns", "1+2=", "7*8=", engine=_engine(built), n=2,
                        max_tokens=6)
    assert len(rows) == 4 and {r["parent_id"] for r in rows} == {None}
    assert {(r["n_turns"], r["episode_end"]) for r in rows} == {(3, "done")}
    assert [r["reward"] for r in rows] == [0.25] * 4 and not any(r["score_error"] for r in rows)
    # each wave is one engine call: the 4 episodes' 3 calls are 3 calls of 4 requests
    assert [len(requests) for requests, _, _ in engine.calls] == [4, 4, 4]
    asked: dict[tuple[int, ...], list[Any]] = {}  # prompt ids -> the outputs for them
    for requests, _, outs in engine.calls:
        for q, o in zip(requests, outs):
            asked.setdefault(tuple(q.prompt_ids), []).append(o)
    round_trips = 0
    for row in rows:
        turns = row["turns"]
        assert [t["source"] for t in turns] == ["environment", "policy"] * 3
        context_ids = list(turns[0]["token_ids"])
        for k in range(3):  # call k's prompt is the row so far; its output is the next turn
            outs = asked[tuple(context_ids)]  # samples of one task share their first prompt
            out = next(o for o in outs if o.completion_ids == turns[2 * k + 1]["token_ids"])
            outs.remove(out)  # each engine output is one turn of one row
            assert turns[2 * k + 1]["logprobs"] == pytest.approx(out.logprobs, abs=1e-6)
            context_ids += out.completion_ids + (turns[2 * k + 2]["token_ids"] if k < 2 else [])
        ids = row["completion_ids"]
        assert row["prompt_ids"] + ids == context_ids
        mask = loss_mask(turns)
        forced = engine.forced_logprobs(row["prompt_ids"], ids, 1.0)
        stored = row["logprobs"]
        assert [s for s, m in zip(stored, mask) if m] == pytest.approx(
            [f for f, m in zip(forced, mask) if m], abs=1e-4)
        assert not any(stored[i] for i, m in enumerate(mask) if not m)
        policy_ids = [t for turn in turns if turn["source"] == "policy" for t in turn["token_ids"]]
        round_trips += engine.encode(engine.decode(policy_ids)) == policy_ids
    assert not any(asked.values())  # every engine output is in a row
    # the random policy writes ids that do not survive decode + encode (EOS, broken UTF-8,
    # BPE merges): the rows hold them all the same, so nothing was re-tokenized
    assert round_trips < len(rows)


def test_the_client_sees_the_generated_text_and_usage():
    rows, engine = _run("three_turns", "1+2=", n=1, max_tokens=6)
    replies = agents.SEEN
    policy_turns = [t for t in rows[0]["turns"] if t["source"] == "policy"]
    for reply, turn, (requests, _, _) in zip(replies, policy_turns, engine.calls):
        assert reply.choices[0].message.content == engine.decode(turn["token_ids"])
        assert reply.usage.completion_tokens == len(turn["token_ids"])
        assert reply.usage.prompt_tokens == len(requests[0].prompt_ids)
        assert reply.choices[0].finish_reason in ("stop", "length")


def test_a_tool_call_the_policy_writes_reaches_the_agent_and_the_tool_turn_is_masked():
    policy = POLICY.build(seed=0)
    engine = _engine(policy)
    codec = OpenAIChat(chat_format(policy.tokenizer))
    prompt = codec.render([{"role": "user", "content": "3*7?"}], agents.CALCULATOR)
    agents.taught(policy, prompt, engine.encode(agents.TOOL_CALL) + [policy.tokenizer.eos_token_id])
    rows, engine = _run("tool_user", "3*7?", engine=engine, n=1, temperature=0.0,
                        max_tokens=len(agents.TOOL_CALL) + 1)
    first = agents.SEEN[0].choices[0]
    assert first.finish_reason == "tool_calls" and first.message.content is None
    (call,) = first.message.tool_calls
    assert call.function.name == "calculator"
    assert openai.types.chat.ChatCompletionMessageFunctionToolCall.model_validate(
        call.model_dump()).function.arguments == '{"expression": "3*7"}'
    (row,) = rows
    assert row["reward"] == 1.0  # the agent ran the call and got 21
    turns = row["turns"]
    assert [(t["role"], t["source"]) for t in turns] == [
        ("user", "environment"), ("assistant", "policy"), ("tool", "tool"),
        ("assistant", "policy")]
    assert turns[0]["token_ids"] == prompt
    assert engine.decode(turns[1]["token_ids"]) == agents.TOOL_CALL
    assert turns[2]["tool_name"] == "calculator"
    assert engine.decode(turns[2]["token_ids"]) == "\n<tool_response>21</tool_response>"
    assert turns[2]["mask"] is None and turns[1]["mask"] == [True] * len(turns[1]["token_ids"])


def test_a_call_that_does_not_extend_the_context_starts_a_branch():
    rows, engine = _run("brancher", "q", n=1, max_tokens=4)
    assert len(rows) == 2
    root, branch = rows
    assert root["parent_id"] is None and branch["parent_id"] == root["rollout_id"]
    assert [t["source"] for t in root["turns"]] == ["environment", "policy"] * 2
    assert [t["source"] for t in branch["turns"]] == ["environment", "policy"] * 2
    assert engine.decode(branch["prompt_ids"]).endswith("a summary\ngo on")
    assert branch["reward"] == root["reward"] == 0.5
    assert branch["group_id"] == root["group_id"] and branch["rollout_id"] != root["rollout_id"]


def test_an_agent_that_raises_hangs_or_returns_nonsense_is_recorded_and_the_step_goes_on():
    agents.RELEASE.clear()
    try:
        rows, _ = _run("flaky", "raise", "hang", "nan", "ok", n=1, timeout=3.0, window=0.05)
    finally:
        agents.RELEASE.set()
    by = {r["prompt"]: r for r in rows}
    assert by["raise"]["score_error"] == "ValueError: the agent broke"
    assert by["hang"]["score_error"].startswith("Timeout: the agent ran past 3 s")
    assert "not a finite number" in by["nan"]["score_error"]
    assert by["ok"]["score_error"] is None and by["ok"]["reward"] == 1.0
    assert {k: r["episode_end"] for k, r in by.items()} == {
        "raise": "env_error", "hang": "env_timeout", "nan": "env_error", "ok": "done"}
    for name in ("raise", "hang", "nan"):
        assert by[name]["reward"] == 0.0 and by[name]["kept"]
        assert len(by[name]["completion_ids"]) > 0  # its call before failing is recorded


def test_failed_episodes_can_be_dropped_and_a_step_where_all_fail_stops():
    rows, _ = _run("flaky", "raise", "ok", n=1, on_error="drop")
    by = {r["prompt"]: r for r in rows}
    assert not by["raise"]["kept"] and by["raise"]["dropped_by"] == "agent"
    assert by["ok"]["kept"]
    with pytest.raises(AgentFailed, match="failed on all 2 episodes .*no agent today"):
        _run("always_raises", "a", n=2)


def test_the_plans_n_and_max_tokens_set_each_tasks_episodes_and_cap():
    table = plan("1+2=", "3+4=").append_column("n", pa.array([1, 3], pa.int64())) \
        .append_column("max_tokens", pa.array([2, None], pa.int64()))
    stage = AgentEnv(agent=REF + "three_turns", max_tokens=16, window=5.0)
    rows = conform(stage.generate(context(), table, _engine(), None)).to_pylist()
    assert [r["prompt"] for r in rows] == ["1+2="] + ["3+4="] * 3
    lengths = [[len(t["token_ids"]) for t in r["turns"] if t["source"] == "policy"]
               for r in rows]
    assert max(lengths[0]) <= 2 and max(max(x) for x in lengths[1:]) > 2  # the agent asks 6


def test_an_agent_closing_its_client_leaves_the_others_theirs():
    rows, engine = _run("closes_its_client", "a", "b", n=3)
    assert [r["score_error"] for r in rows] == [None] * 6
    assert [len(requests) for requests, _, _ in engine.calls] == [6]


def test_an_episode_past_its_call_limit_is_refused_and_recorded():
    rows, _ = _run("calls", "2", "3", n=1, max_calls=2)
    fine, over = rows
    assert fine["score_error"] is None and fine["n_turns"] == 2
    assert over["score_error"].startswith("BadRequestError")
    assert "made its 2 calls (AgentEnv.max_calls)" in over["score_error"]
    assert over["n_turns"] == 2 and over["episode_end"] == "env_error"


def test_the_endpoint_refuses_what_it_does_not_serve_with_api_errors():
    engine = _engine()
    waves = Waves(window=0.0)
    codec = OpenAIChat(chat_format(engine.policy.tokenizer))
    with AgentServer(waves, engine.decode, model="policy", max_tokens=4, wait=5.0) as server:
        episode = Episode(0, codec)
        client = openai.OpenAI(base_url=server.open(episode), api_key="x", max_retries=0)
        assert [m.id for m in client.models.list().data] == ["policy"]
        chat = client.chat.completions
        messages = [{"role": "user", "content": "hi"}]
        with pytest.raises(openai.BadRequestError, match="stream=true is not supported"):
            chat.create(model="policy", messages=messages, stream=True)
        with pytest.raises(openai.BadRequestError, match="n=2"):
            chat.create(model="policy", messages=messages, n=2)
        with pytest.raises(openai.BadRequestError, match=r"messages\[0\] must be"):
            chat.create(model="policy", messages=[{"role": "robot", "content": "x"}])
        with httpx.Client(base_url=server.open(episode)) as http:  # one kept-alive connection
            assert http.post("/nope", json={"messages": messages}).status_code == 404
            assert http.get("/models").json()["data"][0]["id"] == "policy"
        server.end(episode, "the episode ended")
        with pytest.raises(openai.APIStatusError, match="this episode has ended") as gone:
            chat.create(model="policy", messages=messages)
        assert gone.value.status_code == 410
        stranger = openai.OpenAI(base_url=f"http://127.0.0.1:{server.port}/ep/nope/v1",
                                 api_key="x", max_retries=0)
        with pytest.raises(openai.NotFoundError, match="unknown episode"):
            stranger.models.list()
    assert not episode.calls


def test_the_agent_reference_is_checked():
    with pytest.raises(ValueError, match="'module:function'"):
        AgentEnv(agent="not a reference")
    with pytest.raises(ValueError, match="cannot import stage 'agent': agent"):
        _run("no_such_agent", "x", n=1)
