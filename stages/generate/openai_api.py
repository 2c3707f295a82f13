"""An OpenAI-compatible chat endpoint over the step's engine, for agents written against
the ``openai`` client (what rLLM, verifiers, AReaL and Tinker offer their users).

Routes, under each episode's base URL ``http://127.0.0.1:PORT/ep/<token>/v1``:

- ``GET  /models``: the one model served (its name is any the client likes to pass);
- ``POST /chat/completions``: non-streaming chat completions, with ``tools``;
- ``POST /responses``: the Responses API, served by the same path
  (:mod:`stages.generate._openai_responses`).

A request waits on the turn-wave queue (:mod:`stages.generate._waves`); on the stage's
thread, its messages become token ids through the episode's record
(:mod:`stages.generate._episodes`: the stored ids of a conversation it extends, and only
its new messages rendered: :meth:`AgentServer.prepare`), each wave is generated in one
engine call, and tool calls are read from the generated text
(:mod:`stages.endpoint._toolcalls`: :meth:`AgentServer.finish`); the answer carries
``usage``. An episode gets at most ``max_calls`` answers. Sampling is the stage's:
``temperature`` and ``top_p`` of a request are ignored, so the behaviour logprobs match
what the trainer computes; its ``max_tokens`` (or ``max_completion_tokens``) and ``stop``
apply, ``max_tokens`` capped by the stage's. ``n`` must be 1 and ``stream`` false (the
stage samples ``n`` episodes itself). Other fields (``tool_choice``, ``response_format``,
``logprobs``, ``seed``, ...) are ignored. Errors come back as the API's error objects
(the client raises them), never with an exception's text.

One request fails only itself: a conversation longer than the context (``context``
tokens) is refused with a 400 ``context_length_exceeded`` before it is rendered, by its
characters (:mod:`stages.endpoint._limits`), then by its rendered ids; one whose content
is not text, or that renders to nothing, is refused too; the stage's thread answers an
engine's error to the request that caused it alone (:mod:`stages.generate.agent`).
Connections are bounded, with read timeouts (:mod:`stages.endpoint._http`).

The server binds 127.0.0.1 on a free port, lives for one generate call, and knows only
the episodes the stage opened: each episode's URL holds a random token, and a request
for an episode that ended (finished, timed out) is refused.
"""

from __future__ import annotations

import secrets
import threading
import time
from typing import Any, Callable

from gfcr.core.engine import GenOutput
from stages.endpoint._http import MAX_BODY, ApiError, BoundedServer
from stages.endpoint._limits import text_chars
from stages.endpoint._toolcalls import declared_names, parse
from stages.generate._episodes import Episode
from stages.generate._openai_responses import responses
from stages.generate._waves import Ask, Waves

ROLES = {"system", "developer", "user", "assistant", "tool"}
TOO_LONG = "context_length_exceeded"
"""The error code of a conversation longer than the context (OpenAI's)."""


class AgentServer:
    """The endpoint for one generate call (a context manager: started on enter)."""

    def __init__(self, waves: Waves, decode: Callable[[list[int]], str], *, model: str,
                 max_tokens: int, wait: float, max_calls: int = 2**31,
                 context: int | None = None, token_chars: int = 64,
                 max_connections: int = 128, read_timeout: float = 60.0) -> None:
        self.waves, self.decode, self.model = waves, decode, model
        self.max_tokens, self.wait, self.max_calls = max_tokens, wait, max_calls
        self.context = context
        """Most tokens a prompt and its completion may hold (None: unbounded here)."""
        self.max_chars = None if context is None else context * token_chars
        """Characters past which a conversation cannot fit ``context`` (gfcr's _limits)."""
        self.episodes: dict[str, Episode] = {}
        self._ended: set[str] = set()
        self._lock = threading.Lock()
        body = MAX_BODY if self.max_chars is None else min(MAX_BODY,
                                                           6 * self.max_chars + 2**20)
        self._http = BoundedServer(self._route, max_connections=max_connections,
                                   read_timeout=read_timeout, max_body=body)
        self._thread = threading.Thread(target=self._http.serve_forever, daemon=True,
                                        name="gfcr-agent-server")

    @property
    def port(self) -> int:
        return int(self._http.server_address[1])

    def __enter__(self) -> "AgentServer":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.waves.close("the generate step ended")
        self._http.shutdown()
        self._http.server_close()
        self._thread.join()

    def open(self, episode: Episode) -> str:
        """Serve ``episode``; returns its base URL."""
        token = secrets.token_hex(12)
        with self._lock:
            self.episodes[token] = episode
        return f"http://127.0.0.1:{self.port}/ep/{token}/v1"

    def end(self, episode: Episode, reason: str) -> None:
        """Refuse ``episode``'s further requests and drop its queued ones."""
        with self._lock:
            self._ended |= {t for t, e in self.episodes.items() if e is episode}
        self.waves.drop(episode, reason)

    def episode(self, token: str) -> Episode:
        with self._lock:
            if token in self._ended:
                raise ApiError(410, "this episode has ended (finished or timed out); "
                                    "gfcr answers no more of its requests", "episode_ended")
            if token not in self.episodes:
                raise ApiError(404, "unknown episode: use the client gfcr passes to the "
                                    "agent function", "not_found")
            return self.episodes[token]

    # ------------------------------------------------------------------ routes

    def _route(self, method: str, path: str, body: Any) -> dict[str, Any]:
        token, route = _split(path)
        if method == "POST" and route == "/responses":
            return responses(lambda chat: self.chat(self.episode(token), chat), body)
        want = "/models" if method == "GET" else "/chat/completions"
        if route != want:
            raise ApiError(404, f"no route {method} {route[:80]!r}; gfcr serves GET "
                                "/v1/models, POST /v1/chat/completions and POST "
                                "/v1/responses", "not_found")
        episode = self.episode(token)
        return self.models() if method == "GET" else self.chat(episode, body)

    def models(self) -> dict[str, Any]:
        return {"object": "list", "data": [{"id": self.model, "object": "model",
                                            "created": 0, "owned_by": "gfcr"}]}

    def chat(self, episode: Episode, body: dict[str, Any]) -> dict[str, Any]:
        """A request thread's call: checked here, answered by the stage's thread."""
        messages, tools = _checked(body)
        if self.max_chars is not None and text_chars([messages, tools],
                                                     self.max_chars) > self.max_chars:
            raise ApiError(400, f"this conversation is longer than the policy's context "
                                f"of {self.context} tokens (more than {self.max_chars} "
                                "characters); shorten it", code=TOO_LONG)
        if not episode.admit(self.max_calls):
            raise ApiError(400, f"this episode has made its {self.max_calls} calls "
                                "(AgentEnv.max_calls); gfcr answers no more", "call_limit")
        cap = min(self.max_tokens, episode.max_tokens or self.max_tokens)
        ask = Ask(episode, messages, tools, _cap(body, cap), _stops(body))
        self.waves.put(ask)
        if not ask.done.wait(self.wait):
            raise ApiError(503, f"no answer within {self.wait:g} s", "unavailable")
        if ask.response is None:
            raise ApiError(ask.status, ask.error or "no answer",
                           "invalid_request_error" if ask.status < 500 else "unavailable",
                           ask.code)
        return ask.response

    # ------------------------------------------------------------------ the stage's thread

    def prepare(self, ask: Ask) -> list[int] | None:
        """The ask's prompt ids (its call recorded on the ask), or None after answering
        it with the error its messages raised when rendered."""
        try:
            ids, ask.call = ask.episode.prompt(ask.messages, ask.tools)
        except Exception as err:  # noqa: BLE001 - the request's fault, answered to it
            ask.fail(400, f"the messages cannot be rendered for the policy: "
                          f"{type(err).__name__}: {str(err)[:300]}")
            return None
        if not ids:
            ask.fail(400, "the messages render to no tokens: give a message some text")
            return None
        if self.context is not None:
            if len(ids) >= self.context:
                ask.fail(400, f"this conversation is {len(ids)} tokens, and the policy's "
                              f"context holds {self.context} with room for the answer; "
                              f"shorten it", TOO_LONG)
                return None
            ask.max_tokens = min(ask.max_tokens, self.context - len(ids))
        return ids

    def finish(self, ask: Ask, out: GenOutput) -> None:
        """Answer ``ask`` with what the engine generated, parsed, and record the call."""
        episode, call = ask.episode, ask.call
        assert call is not None, "prepare() comes first"
        call_id = f"call_{episode.index}_{len(episode.calls)}"
        content, calls = parse(self.decode(out.completion_ids), declared_names(ask.tools),
                               call_id)
        reply: dict[str, Any] = {"role": "assistant", "content": content}
        if calls:
            reply["tool_calls"] = calls
        episode.answered(call, out, ask.messages, ask.tools, reply)
        finish = "tool_calls" if calls else ("length" if out.finish_reason == "length"
                                            else "stop")
        n_in, n_out = len(call.prompt_ids), len(out.completion_ids)
        ask.answer({"id": f"chatcmpl-{secrets.token_hex(8)}", "object": "chat.completion",
                    "created": int(time.time()), "model": self.model,
                    "choices": [{"index": 0, "message": reply, "finish_reason": finish,
                                 "logprobs": None}],
                    "usage": {"prompt_tokens": n_in, "completion_tokens": n_out,
                              "total_tokens": n_in + n_out}})


def _checked(body: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """The request's messages and tools, or ApiError naming what is wrong."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    if body.get("stream"):
        raise ApiError(400, "stream=true is not supported by gfcr's endpoint; "
                            "call without streaming")
    if body.get("n", 1) != 1:
        raise ApiError(400, f"n={body.get('n')!r}: gfcr's endpoint answers one choice "
                            "per request (AgentEnv.n sets the samples per task)")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "messages must be a non-empty list")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise ApiError(400, f"messages[{i}] must be an object whose role is one of "
                                f"{sorted(ROLES)}; got {str(m)[:80]!r}")
        if not _content_ok(m.get("content")):
            raise ApiError(400, f"messages[{i}].content must be a string, null or a list "
                                f"of text parts ({{'type': 'text', 'text': ...}}); got "
                                f"{str(m.get('content'))[:80]!r}")
        if not _calls_ok(m.get("tool_calls")):
            raise ApiError(400, f"messages[{i}].tool_calls must be a list of "
                                "{'function': {'name': str, 'arguments': str}} objects")
    tools = body.get("tools")
    if tools is not None and not (isinstance(tools, list)
                                  and all(isinstance(t, dict) for t in tools)):
        raise ApiError(400, "tools must be a list of tool objects")
    return messages, tools or None


def _content_ok(content: Any) -> bool:
    if content is None or isinstance(content, str):
        return True
    return isinstance(content, list) and all(
        isinstance(p, dict) and isinstance(p.get("text", ""), str) for p in content)


def _calls_ok(calls: Any) -> bool:
    if calls is None:
        return True
    return isinstance(calls, list) and all(
        isinstance(c, dict) and isinstance(c.get("function"), dict)
        and isinstance(c["function"].get("name"), str)
        and isinstance(c["function"].get("arguments", ""), str) for c in calls)


def _cap(body: dict[str, Any], cap: int) -> int:
    asked = body.get("max_completion_tokens") or body.get("max_tokens")
    if asked is None:
        return cap
    if isinstance(asked, bool) or not isinstance(asked, int) or asked < 1:
        raise ApiError(400, f"max_tokens={asked!r} must be a positive integer")
    return min(asked, cap)


def _stops(body: dict[str, Any]) -> tuple[str, ...]:
    stop = body.get("stop")
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    if not all(isinstance(s, str) and s for s in stops):
        raise ApiError(400, f"stop={str(stop)[:80]!r} must be a non-empty string or a list of them")
    return tuple(stops)


def _split(path: str) -> tuple[str, str]:
    """(episode token, route) of ``/ep/<token>/v1/<route>``."""
    parts = path.split("?", 1)[0].split("/")
    if len(parts) < 5 or parts[1] != "ep" or parts[3] != "v1":
        raise ApiError(404, f"no route {path[:80]!r}; use the base URL of the client gfcr "
                            "passes to the agent (…/ep/<token>/v1)", "not_found")
    return parts[2], "/" + "/".join(parts[4:])
