"""The gate of a fleet server (issue 30): an ASGI middleware that ``gfcr engine serve``
puts in front of every route of vLLM's server (vLLM's ``--middleware``), so the server
obeys only the run that holds the fleet's key.

- ``GET /health`` is open (liveness only);
- every other route needs ``Authorization: Bearer KEY``, KEY the text of the fleet's key
  file (``GFCR_FLEET_KEY_FILE``, owner-only, as a score pool's key:
  gfcr.transport.remote.keys.read_key); 401 otherwise. vLLM's own ``--api-key`` guards
  only ``/v1``, ``/v2``, ``/inference`` and ``/cohere``, not the weight routes;
- with the key, only what a fleet uses: ``POST /inference/v1/generate``,
  ``POST /inference/v1/abort_requests``, gfcr's ``POST /gfcr/load`` and
  ``GET /gfcr/weights``, and the read-only ``/version``, ``/v1/models``, ``/metrics``;
  anything else is 403 (the server runs without vLLM's development routes, so
  ``/collective_rpc``, ``/update_weight_version``, ``/pause``, ``/sleep`` do not exist);
- ``POST /gfcr/load {"folder": F}`` has every worker load the published version in F
  (gfcr's worker extension, which checks it first, gfcr.transport.fleet_extension), then
  labels the weights ``"<version>:<publication id>"`` from F's manifest and drops the
  prefix cache. The label is set here and nowhere else, so the per-token version check
  of the run (stages.engines.fleet) names what was loaded. A refused load is a 400 with
  the reason; the previous weights and label stay.

Without a key file the gate lets every caller in (a server on the loopback address only:
``gfcr engine serve`` refuses any other host without a key) but still allows only the
routes above.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import os
from pathlib import Path
from typing import Any

from gfcr.transport.remote.keys import read_key

KEY_ENV = "GFCR_FLEET_KEY_FILE"
ROOT_ENV = "GFCR_FLEET_WEIGHTS_ROOT"
LOAD, WEIGHTS = "/gfcr/load", "/gfcr/weights"
OPEN = {("GET", "/health"), ("HEAD", "/health")}
ALLOWED = {("POST", "/inference/v1/generate"), ("POST", "/inference/v1/abort_requests"),
           ("GET", "/version"), ("GET", "/v1/models"), ("GET", "/metrics"),
           ("GET", "/metrics/")}
MAX_BODY = 1 << 16


def fleet_key(path: str | Path | None) -> bytes | None:
    """The fleet's key from ``path`` or the file ``GFCR_FLEET_KEY_FILE`` names (checked
    as a pool key is); None when neither names one."""
    chosen = path or os.environ.get(KEY_ENV)
    return read_key(Path(chosen).expanduser(), "fleet key") if chosen else None


class FleetGate:
    """The middleware (see the module); vLLM builds it with the app alone, so it reads
    its key file from the environment."""

    def __init__(self, app: Any) -> None:
        self.app = app
        key = fleet_key(None)
        self._digest = hashlib.sha256(key).digest() if key is not None else None
        self._lock: asyncio.Lock | None = None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        path = scope["path"].removeprefix(scope.get("root_path", ""))
        route = (scope.get("method", "GET"), path)
        if route in OPEN:
            await self.app(scope, receive, send)
        elif not self._holds_key(scope):
            await _answer(scope, send, 401, "this server needs the fleet's key "
                          "(Authorization: Bearer; gfcr reads it from GFCR_FLEET_KEY_FILE)")
        elif route == ("POST", LOAD):
            await self._load(scope, receive, send)
        elif route == ("GET", WEIGHTS):
            label = await scope["app"].state.engine_client.get_weight_version()
            await _answer(scope, send, 200, None, {"label": label})
        elif route in ALLOWED:
            await self.app(scope, receive, send)
        else:
            await _answer(scope, send, 403, f"{route[0]} {path} is not a route of a gfcr "
                          f"fleet server (gfcr.transport.fleet_gate)")

    def _holds_key(self, scope: dict[str, Any]) -> bool:
        if self._digest is None:
            return True
        headers = dict(scope.get("headers") or [])
        scheme, _, token = headers.get(b"authorization", b"").partition(b" ")
        given = hashlib.sha256(token.strip()).digest()
        return scheme.lower() == b"bearer" and hmac.compare_digest(given, self._digest)

    async def _load(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """One load at a time: check and load on every worker, then label (see the
        module)."""
        try:
            body = json.loads(await _body(receive))
            folder = body["folder"]
            if not isinstance(folder, str):
                raise TypeError("'folder' is not a string")
        except (ValueError, KeyError, TypeError) as err:
            await _answer(scope, send, 400, f"POST {LOAD} takes {{\"folder\": PATH}}: {err}")
            return
        engine = scope["app"].state.engine_client
        self._lock = self._lock or asyncio.Lock()
        async with self._lock:
            try:
                results = await engine.collective_rpc("gfcr_load", args=(folder,))
            except Exception as err:  # the worker's refusal: BadVersion, or vLLM's own
                await _answer(scope, send, 400, f"load of {folder!r} refused, the previous "
                              f"weights still serve: {str(err)[-1500:]}")
                return
            first = dict(results[0])
            if any(dict(r) != first for r in results):
                await _answer(scope, send, 500, f"workers loaded different versions: {results}")
                return
            label = f"{int(first['version'])}:{first['id']}"
            await engine.update_weight_version(label)
            reset = await engine.reset_prefix_cache()
        await _answer(scope, send, 200, None, {**first, "label": label, "cache_reset": reset})


async def _body(receive: Any) -> bytes:
    chunks, size = [], 0
    while True:
        message = await receive()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY:
            raise ValueError(f"body over {MAX_BODY} bytes")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _answer(scope: dict[str, Any], send: Any, status: int, error: str | None,
                  content: dict[str, Any] | None = None) -> None:
    """A JSON answer (``{"error": ...}`` when ``error``); a websocket is closed."""
    if scope["type"] == "websocket":
        await send({"type": "websocket.close", "code": 1008})
        return
    data = json.dumps(content if error is None else {"error": error}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(data)).encode())]})
    await send({"type": "http.response.body", "body": data})
