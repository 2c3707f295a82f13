"""An environment served over HTTP, in OpenEnv's reset/step shapes.

OpenEnv (meta-pytorch/OpenEnv) serves an environment as ``POST /reset`` (body: ``seed``,
``episode_id`` and any extra fields) and ``POST /step`` (body: ``{"action": {...}}`` and
optional ``timeout_s``, ``request_id``), each answered with ``{"observation": {...},
"reward": float | null, "done": bool, "metadata": {...}}``. :class:`RemoteTextEnv` speaks
that as a Gymnasium-style text environment (:mod:`stages.envs.gym`): the policy's reply
is the action's ``action_key`` field, the observation's ``observation_key`` field is what
the policy sees next (defaults: TextArena's OpenEnv server, ``message`` and ``prompt``).
Each episode sends its own ``episode_id`` with every call, so a server that keeps one
environment per episode can tell them apart; a server holding a single environment
serves one episode at a time (run one server per concurrent episode, or
``env_workers=1``).

Boundaries. It talks only to the URL it was given: ``http`` or ``https``, the routes
appended to its path, no redirect followed, no proxy from the environment. Every call has
a deadline (``timeout`` seconds for the whole exchange, connect to last byte) and a
bounded answer (``max_bytes``; a longer one is refused). A server that refuses the
connection, dies mid-episode, answers with an HTTP error or with something that is not
that shape, or does not answer in time raises :class:`RemoteEnvError`, naming the call
and the cause: the episode ends with it recorded (``episode_end`` ``env_error``, its
``score_error``) and the run goes on.
"""

from __future__ import annotations

import http.client
import json
import math
import socket
import time
import uuid
from typing import Any
from urllib.parse import urlsplit

from pydantic import Field, field_validator

from gfcr.core.environment import register_env
from gfcr.core.spec import Spec
from stages.envs.gym import TextEnvAdapter


class RemoteEnvError(RuntimeError):
    """A remote environment's call failed: no answer, an HTTP error, a bad answer."""


class RemoteOptions(Spec):
    """Options of the ``remote`` environment."""

    url: str
    """The server's base URL, e.g. ``http://127.0.0.1:8000`` (``/reset``, ``/step`` appended)."""
    timeout: float = Field(10.0, gt=0.0, le=3600.0)
    """Seconds one call may take in all, connect to last byte."""
    max_bytes: int = Field(1 << 20, ge=1024, le=1 << 28)
    """Largest answer read; a longer one is an error."""
    action_key: str = "message"
    """The action's field that carries the policy's reply."""
    observation_key: str = "prompt"
    """The observation's field that the policy sees (a string)."""
    system: str | None = None
    """A system message before the first observation."""

    @field_validator("url")
    @classmethod
    def _http(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"url {value!r} is not an http(s) URL with a host")
        if parts.query or parts.fragment or parts.username or parts.password:
            raise ValueError(f"url {value!r}: give scheme, host, port and path only")
        return value.rstrip("/")


class RemoteTextEnv:
    """One episode against an OpenEnv-style HTTP server (Gymnasium-style, text)."""

    def __init__(self, spec: RemoteOptions) -> None:
        self.spec = spec
        self.episode_id = uuid.uuid4().hex

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
              ) -> tuple[str, dict[str, Any]]:
        body: dict[str, Any] = {"seed": seed, "episode_id": self.episode_id}
        if options:
            body.update(options)
        answer = self._call("reset", body)
        return self._observation(answer, "reset"), _metadata(answer)

    def step(self, action: str) -> tuple[str, float | None, bool, bool, dict[str, Any]]:
        answer = self._call("step", {"action": {self.spec.action_key: action},
                                     "episode_id": self.episode_id,
                                     "timeout_s": self.spec.timeout})
        done = answer.get("done", False)
        if not isinstance(done, bool):
            raise RemoteEnvError(f"step: 'done' is {done!r}, not a boolean")
        obs = "" if done else self._observation(answer, "step")
        return obs, _reward(answer.get("reward")), done, False, _metadata(answer)

    def _observation(self, answer: dict[str, Any], call: str) -> str:
        obs = answer.get("observation")
        text = obs.get(self.spec.observation_key) if isinstance(obs, dict) else None
        if not isinstance(text, str):
            raise RemoteEnvError(f"{call}: the answer has no string observation."
                                 f"{self.spec.observation_key} (observation_key)")
        return text

    def _call(self, route: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST ``body`` to the route; the JSON object answered, within the deadline."""
        deadline = time.monotonic() + self.spec.timeout
        parts = urlsplit(self.spec.url)
        kind = (http.client.HTTPSConnection if parts.scheme == "https"
                else http.client.HTTPConnection)
        conn = kind(parts.hostname or "", parts.port, timeout=self.spec.timeout)
        try:
            conn.request("POST", f"{parts.path}/{route}", body=json.dumps(body).encode(),
                         headers={"Content-Type": "application/json"})
            sock = conn.sock  # the response reads from it: each read gets what is left
            if sock is None:
                raise RemoteEnvError(f"{route}: no connection to {self.spec.url}")
            sock.settimeout(max(0.001, deadline - time.monotonic()))
            resp = conn.getresponse()
            raw = _read(resp, sock, self.spec.max_bytes, deadline, route)
        except (socket.timeout, TimeoutError) as err:
            raise RemoteEnvError(f"{route}: no answer from {self.spec.url} within "
                                 f"{self.spec.timeout:g}s") from err
        except (OSError, http.client.HTTPException) as err:
            raise RemoteEnvError(f"{route}: {self.spec.url} failed: "
                                 f"{type(err).__name__}: {err}") from err
        finally:
            conn.close()
        if resp.status != 200:
            raise RemoteEnvError(f"{route}: HTTP {resp.status} from {self.spec.url}: "
                                 f"{raw[:200].decode(errors='replace')}")
        try:
            answer = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise RemoteEnvError(f"{route}: the answer is not JSON ({err})") from err
        if not isinstance(answer, dict):
            raise RemoteEnvError(f"{route}: the answer is {type(answer).__name__}, "
                                 "not an object")
        return answer


def _read(resp: http.client.HTTPResponse, sock: socket.socket, limit: int, deadline: float,
          route: str) -> bytes:
    """The body, at most ``limit`` bytes, before ``deadline`` (a trickle is cut off)."""
    length = resp.getheader("Content-Length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise RemoteEnvError(f"{route}: the answer is {length} bytes; max_bytes is {limit}")
    chunks: list[bytes] = []
    size = 0
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        sock.settimeout(left)
        chunk = resp.read1(65536)
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > limit:
            raise RemoteEnvError(f"{route}: the answer passed max_bytes ({limit})")
        chunks.append(chunk)


def _reward(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(float(value)):
        raise RemoteEnvError(f"step: reward {value!r} is not a finite number")
    return float(value)


def _metadata(answer: dict[str, Any]) -> dict[str, Any]:
    meta = answer.get("metadata")
    return dict(meta) if isinstance(meta, dict) else {}


@register_env("remote")
def remote(**options: Any) -> TextEnvAdapter:
    """An environment served over HTTP in OpenEnv's reset/step shapes (:class:`RemoteOptions`)."""
    spec = RemoteOptions(**options)
    return TextEnvAdapter(RemoteTextEnv(spec), system=spec.system)
