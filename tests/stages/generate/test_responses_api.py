"""gfcr's endpoint serves the OpenAI Responses API (``/v1/responses``) to agents written
against the real ``openai`` client: the rows are the engine's ids turn by turn, with
logprobs equal to a teacher-forced pass, exactly as for chat completions."""

from __future__ import annotations

from typing import Any

import pytest

from gfcr.chat.formats import chat_format
from gfcr.core.rollout import conform
from gfcr.core.trajectory import loss_mask
from stages import HF, AgentEnv, TinyLlama
from stages.generate._episodes import Episode
from stages.endpoint._http import ApiError
from stages.endpoint._openai_chat import OpenAIChat
from stages.generate._openai_responses import to_chat
from stages.generate._waves import Waves
from stages.generate.openai_api import AgentServer
from tests.resources import responses_agents as agents
from tests.resources.agents import Recording, needs_openai, plan, taught
from tests.resources.rollouts import context

openai = needs_openai()

POLICY = TinyLlama(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64,
                   max_position=1024)
TOOL_CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "3*7"}}</tool_call>'


def _run(agent: str, *prompts: str, engine: Recording, **fields: Any) -> list[dict[str, Any]]:
    agents.SEEN.clear()
    stage = AgentEnv(agent="tests.resources.responses_agents:" + agent,
                     **{"window": 5.0, **fields})
    return conform(stage.generate(context(), plan(*prompts), engine, None)).to_pylist()


def test_a_responses_conversation_is_the_engines_ids_turn_by_turn() -> None:
    engine = Recording(HF(device="cpu").build(POLICY.build(seed=0), seed=0))
    rows = _run("three_turns", "1+2=", "7*8=", engine=engine, n=2, max_tokens=6)
    assert len(rows) == 4 and {r["parent_id"] for r in rows} == {None}  # no re-tokenising
    assert [len(requests) for requests, _, _ in engine.calls] == [4, 4, 4]
    for row in rows:
        turns = row["turns"]
        assert [t["source"] for t in turns] == ["environment", "policy"] * 3
        assert engine.decode(row["prompt_ids"]).count("Answer briefly.") == 1
        mask = loss_mask(turns)
        forced = engine.forced_logprobs(row["prompt_ids"], row["completion_ids"], 1.0)
        assert [s for s, m in zip(row["logprobs"], mask) if m] == pytest.approx(
            [f for f, m in zip(forced, mask) if m], abs=1e-4)
    texts = sorted(r.output_text for r in agents.SEEN)
    policy = sorted(engine.decode(o.completion_ids) for _, _, outs in engine.calls for o in outs)
    assert texts == policy
    first = agents.SEEN[0]
    assert first.object == "response" and first.usage.output_tokens <= 6
    assert first.status in ("completed", "incomplete")


def test_a_function_call_item_reaches_the_agent_and_its_output_is_a_tool_turn() -> None:
    policy = POLICY.build(seed=0)
    engine = Recording(HF(device="cpu").build(policy, seed=0))
    codec = OpenAIChat(chat_format(policy.tokenizer))
    tools = to_chat({"input": "x", "tools": agents.CALCULATOR})["tools"]
    prompt = codec.render([{"role": "user", "content": "3*7?"}], tools)
    taught(policy, prompt, engine.encode(TOOL_CALL) + [policy.tokenizer.eos_token_id])
    (row,) = _run("tool_user", "3*7?", engine=engine, n=1, temperature=0.0,
                  max_tokens=len(TOOL_CALL) + 1)
    (call,) = agents.SEEN[0].output
    assert call.type == "function_call" and call.name == "calculator"
    assert row["reward"] == 1.0
    turns = row["turns"]
    assert [(t["role"], t["source"]) for t in turns] == [
        ("user", "environment"), ("assistant", "policy"), ("tool", "tool"),
        ("assistant", "policy")]
    assert turns[0]["token_ids"] == prompt and turns[2]["tool_name"] == "calculator"
    assert engine.decode(turns[1]["token_ids"]) == TOOL_CALL


@pytest.mark.parametrize("body, message", [
    ({"input": "hi", "previous_response_id": "resp_1"}, "previous_response_id"),
    ({"input": []}, "input must be"),
    ({"input": [{"type": "web_search_call"}]}, "is not served"),
    ({"input": "hi", "tools": [{"type": "web_search"}]}, r"tools\[0\] must be a function"),
    ({"input": [{"role": "robot", "content": "x"}]}, r"input\[0\].role"),
    ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]}, "text parts"),
])
def test_a_request_gfcr_does_not_serve_is_a_400_naming_why(body: Any, message: str) -> None:
    with pytest.raises(ApiError, match=message) as err:
        to_chat(body)
    assert err.value.status == 400


def test_the_endpoints_limits_hold_for_responses() -> None:
    engine = HF(device="cpu").build(POLICY.build(seed=0), seed=0)
    codec = OpenAIChat(chat_format(engine.policy.tokenizer))
    with AgentServer(Waves(window=0.0), engine.decode, model="policy", max_tokens=4,
                     wait=5.0, max_calls=0, context=64) as server:
        client = openai.OpenAI(base_url=server.open(Episode(0, codec)), api_key="x",
                               max_retries=0)
        with pytest.raises(openai.BadRequestError, match="stream=true is not supported"):
            client.responses.create(model="policy", input="hi", stream=True)
        with pytest.raises(openai.BadRequestError, match="longer than the policy's context"):
            client.responses.create(model="policy", input="x" * 100_000)
        with pytest.raises(openai.BadRequestError, match="made its 0 calls"):
            client.responses.create(model="policy", input="hi")
