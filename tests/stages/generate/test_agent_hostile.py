"""The agent endpoint under hostile requests (drills A1, A2, A5, A6): one request fails
only itself, every error is a JSON API error, connections are bounded."""

from __future__ import annotations

import json
import socket
import threading
import time
from typing import Any

import pytest

from gfcr.chat.formats import chat_format
from gfcr.core.rollout import conform
from stages import HF, AgentEnv, TinyLlama
from stages.generate._episodes import Episode
from stages.endpoint._openai_chat import OpenAIChat
from stages.generate._waves import Waves
from stages.generate.openai_api import AgentServer
from tests.resources import agents
from tests.resources.agents import Poisoned, Recording, needs_openai, plan
from tests.resources.rollouts import context

openai = needs_openai()

POLICY = TinyLlama(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64,
                   max_position=1024)
AGENT = "tests.resources.agents:hostile"


def _run(*prompts: str, engine: Recording | None = None, **fields: Any
         ) -> tuple[dict[str, dict[str, Any]], Recording]:
    engine = engine or Recording(HF(device="cpu").build(POLICY.build(seed=0), seed=0))
    stage = AgentEnv(agent=AGENT, n=1, window=5.0, **fields)
    rows = conform(stage.generate(context(), plan(*prompts), engine, None)).to_pylist()
    return {r["prompt"]: r for r in rows}, engine


def test_an_overlong_message_is_a_400_for_that_request_alone(monkeypatch) -> None:
    rendered: list[int] = []
    render = OpenAIChat.render

    def spy(self: OpenAIChat, messages: Any, tools: Any) -> list[int]:
        rendered.append(sum(len(str(m.get("content"))) for m in messages))
        return render(self, messages, tools)

    monkeypatch.setattr(OpenAIChat, "render", spy)
    by, engine = _run("huge", "long", "a", "b", max_context=300)
    assert rendered and max(rendered) < 300  # refused before rendering
    for bad in ("huge", "long"):
        assert by[bad]["score_error"].startswith("BadRequestError: Error code: 400")
        assert "longer than the policy's context of 300 tokens" in by[bad]["score_error"]
    assert by["a"]["score_error"] is None and by["b"]["score_error"] is None
    assert by["a"]["reward"] == by["b"]["reward"] == 1.0
    asked = [len(r.prompt_ids) for requests, _, _ in engine.calls for r in requests]
    assert sorted(asked) == [1, 1]  # neither long prompt reached the engine


def test_one_malformed_message_fails_only_itself() -> None:
    by, engine = _run("null", "empty", "poison", "a", "b",
                      engine=Poisoned(HF(device="cpu").build(POLICY.build(seed=0), seed=0)))
    assert "messages[0].content must be a string" in by["null"]["score_error"]
    assert "render to no tokens" in by["empty"]["score_error"]
    assert by["poison"]["score_error"].startswith("InternalServerError: Error code: 503")
    assert "the engine failed on this request (ValueError)" in by["poison"]["score_error"]
    assert "poisoned the call" not in by["poison"]["score_error"]  # no exception text
    assert [by[p]["score_error"] for p in ("a", "b")] == [None, None]
    assert [by[p]["reward"] for p in ("a", "b")] == [1.0, 1.0]
    served = [len(requests) for requests, _, outputs in engine.calls if outputs]
    assert sum(served) == 2  # a and b, answered after the poisoned call was split


@pytest.fixture
def server() -> Any:
    policy = POLICY.build(seed=0)
    engine = HF(device="cpu").build(policy, seed=0)
    waves = Waves(window=0.0)
    with AgentServer(waves, engine.decode, model="policy", max_tokens=4, wait=5.0,
                     context=1024, token_chars=1, max_connections=8,
                     read_timeout=1.0) as srv:
        episode = Episode(0, OpenAIChat(chat_format(policy.tokenizer)))
        srv.url = srv.open(episode)
        yield srv


def _raw(port: int, head: str, body: bytes = b"", timeout: float = 10.0
         ) -> tuple[int, dict[str, Any]]:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(head.encode() + b"\r\n" + body)
        data = b""
        while b"\r\n\r\n" not in data or len(data.split(b"\r\n\r\n", 1)[1]) < _length(data):
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    if not data:
        return 0, {}
    status = int(data.split(b" ", 2)[1])
    return status, json.loads(data.split(b"\r\n\r\n", 1)[1])


def _length(data: bytes) -> int:
    for line in data.split(b"\r\n\r\n", 1)[0].split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return int(line.split(b":")[1])
    return 0


def _post(srv: Any, length: str, body: bytes = b"") -> tuple[int, dict[str, Any]]:
    path = srv.url.split(str(srv.port), 1)[1] + "/chat/completions"
    head = (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {length}\r\nConnection: close\r\n")
    return _raw(srv.port, head, body)


def test_a_bad_content_length_is_a_json_400(server: Any) -> None:
    for length in ("abc", "-1", "1e3"):
        status, payload = _post(server, length)
        assert status == 400 and "Content-Length" in payload["error"]["message"]
        assert payload["error"]["type"] == "invalid_request_error"
    status, payload = _post(server, str(15 * 2**20))  # over the context: refused unread
    assert status == 400 and payload["error"]["code"] == "context_length_exceeded"
    status, payload = _post(server, str(17 * 2**20))  # over any body's bound
    assert status == 413 and payload["error"]["code"] == "context_length_exceeded"
    status, payload = _post(server, "100", b"{}")  # a body never finished: closed at
    assert (status, payload) == (0, {})  # the read timeout, its thread freed


def test_deep_json_is_a_json_400(server: Any) -> None:
    for n in (100_000, 100):
        body = b"[" * n + b"]" * n
        status, payload = _post(server, str(len(body)), body)
        assert status == 400 and "nests deeper than 64" in payload["error"]["message"]
        assert "Error" not in payload["error"]["message"]  # no exception's name or text
    status, payload = _post(server, "9", b"{not json")
    assert status == 400 and payload["error"]["message"].startswith("the request body is not")


def test_idle_connections_are_bounded(server: Any) -> None:
    before = threading.active_count()
    path = server.url.split(str(server.port), 1)[1] + "/chat/completions"
    idle = []
    for _ in range(20):  # headers that promise a body, then nothing (drill A6)
        s = socket.create_connection(("127.0.0.1", server.port), timeout=30.0)
        s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n".encode())
        idle.append(s)
    most, deadline = 0, time.monotonic() + 60.0
    while time.monotonic() < deadline:  # each served one is closed after 1 s of silence
        most = max(most, threading.active_count() - before)
        if all(_closed(s) for s in idle):
            break
        time.sleep(0.05)
    assert 0 < most <= 8  # a thread per connection served, never more than the bound
    assert all(_closed(s) for s in idle)
    client = openai.OpenAI(base_url=server.url, api_key="x", max_retries=0)
    assert [m.id for m in client.models.list().data] == ["policy"]  # still serving


def _closed(s: socket.socket) -> bool:
    """Whether the server closed ``s`` (a read gives end of file), without waiting."""
    s.setblocking(False)
    try:
        return s.recv(4096) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def test_the_context_limit_is_the_smaller_of_the_configured_and_the_policy_s():
    from gfcr.core.capabilities import ContextLength
    from stages.endpoint import _limits

    engine = HF(device="cpu").build(POLICY.model_copy(update={"max_position": 96}).build(seed=0), seed=0)
    assert isinstance(engine, ContextLength) and engine.context_length() == 96
    assert _limits.context_limit(engine, None) == 96
    assert _limits.context_limit(engine, 40) == 40 and _limits.context_limit(engine, 500) == 96
    assert _limits.context_limit(object(), None) is None  # an engine that does not say
