"""One vLLM server of a fleet, over HTTP: vLLM's own routes, nothing of gfcr's.

- ``POST /inference/v1/generate`` (``--enable-scale-out``): token ids in, token ids,
  processed logprobs (``--logprobs-mode processed_logprobs``) and the weight-version
  spans of the generated tokens out; no tokenizer on either side of the wire;
- ``POST /inference/v1/abort_requests``: abort requests by id (a request whose client
  disconnects is aborted by the server too);
- ``POST /gfcr/load`` (gfcr's gate, gfcr.transport.fleet_gate): every worker loads a
  published version (``gfcr.transport.fleet_extension``, which checks it first), then
  the server labels the weights from the version's manifest and drops its prefix cache;
  ``GET /gfcr/weights``: the label the engine holds.

Every call but ``/health`` carries the fleet's key (``Authorization: Bearer``) when the
run has one. Every call has a deadline (``timeout_s``); a transport failure or an HTTP
error raises :class:`ServerError` naming the server and the route.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import httpx

GENERATE = "/inference/v1/generate"
ABORT = "/inference/v1/abort_requests"
LOAD, WEIGHTS = "/gfcr/load", "/gfcr/weights"  # gfcr.transport.fleet_gate


class ServerError(RuntimeError):
    """A server did not answer a call (down, timed out, or an HTTP error)."""

    def __init__(self, url: str, route: str, why: str) -> None:
        super().__init__(f"vLLM server {url}: {route} failed: {why}")
        self.url, self.route, self.why = url, route, why


@dataclass(frozen=True)
class Completion:
    """One generate request's answer."""

    token_ids: list[int]
    logprobs: list[float]
    tops: list[list[tuple[int, float]]]
    """Per token, the top-k (token, logprob) pairs, most likely first (empty: k = 0)."""
    finish_reason: str
    versions: tuple[str, ...]
    """The weight-version labels that sampled these tokens (vLLM's spans)."""
    seconds: float


class Server:
    """An HTTP client of one vLLM server (thread-safe: httpx pools connections)."""

    def __init__(self, url: str, *, timeout_s: float, key: bytes | None = None) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        headers = {"Authorization": "Bearer " + key.decode()} if key is not None else {}
        self._http = httpx.Client(base_url=self.url, timeout=timeout_s, headers=headers,
                                  limits=httpx.Limits(max_connections=256,
                                                      max_keepalive_connections=64))

    def healthy(self) -> bool:
        try:
            return self._http.get("/health", timeout=min(self.timeout_s, 5.0)).status_code == 200
        except httpx.HTTPError:
            return False

    def label(self) -> str:
        """The weight-version label the engine holds ("default": as started)."""
        return str(self._call("GET", WEIGHTS)["label"])

    def load(self, folder: str, label: str) -> dict[str, Any]:
        """Load the version published in ``folder`` (the server checks it, loads it, drops
        its prefix cache and labels it from the manifest); ServerError unless the label
        it set is ``label``, the version the run published."""
        answer = self._call("POST", LOAD, {"folder": folder})
        if answer.get("label") != label:
            raise ServerError(self.url, LOAD, f"loaded {answer!r}, not {label!r} (is the "
                              f"server started with `gfcr engine serve`?)")
        if not answer.get("cache_reset", False):
            raise ServerError(self.url, LOAD, "the prefix cache was not reset")
        return answer

    def generate(self, request_id: str, token_ids: list[int],
                 sampling: dict[str, Any]) -> Completion:
        """Generate from ``token_ids`` with vLLM ``SamplingParams`` fields ``sampling``."""
        started = time.perf_counter()
        body = {"request_id": request_id, "token_ids": token_ids,
                "sampling_params": {**sampling, "detokenize": False}}
        choice = self._call("POST", GENERATE, body)["choices"][0]
        content = (choice.get("logprobs") or {}).get("content") or []
        k = int(sampling.get("logprobs") or 0)
        spans = choice.get("weight_versions") or []
        return Completion(
            token_ids=[int(t) for t in choice["token_ids"]],
            logprobs=[float(c["logprob"]) for c in content],
            tops=[_top(c, k) for c in content] if k else [],
            finish_reason=str(choice.get("finish_reason") or "stop"),
            versions=tuple(str(s["version"]) for s in spans),
            seconds=time.perf_counter() - started)

    def abort(self, request_ids: list[str]) -> None:
        """Abort requests by the ids given to :meth:`generate` (best effort: a server
        that is gone has nothing to abort)."""
        ids = [f"generate-tokens-{r}" for r in request_ids]  # vLLM's prefix for this route
        try:
            self._http.post(ABORT, json={"request_ids": ids}, timeout=5.0)
        except httpx.HTTPError:
            pass

    def close(self) -> None:
        self._http.close()

    def _call(self, method: str, route: str, body: Any = None) -> dict[str, Any]:
        try:
            response = self._http.request(method, route, json=body)
        except httpx.HTTPError as err:
            raise ServerError(self.url, route, f"{type(err).__name__}: {err}") from None
        if response.status_code in (401, 403):
            raise ServerError(self.url, route, f"refused (HTTP {response.status_code}: "
                              f"{response.text[:300]}): the fleet's servers take the key "
                              f"file GFCR_FLEET_KEY_FILE names (Fleet.key_file)")
        if response.status_code != 200:
            raise ServerError(self.url, route,
                              f"HTTP {response.status_code}: {response.text[:300]}")
        return dict(response.json()) if response.content else {}


def _top(content: dict[str, Any], k: int) -> list[tuple[int, float]]:
    """vLLM's per-position candidates (the sampled token first, then by rank) as the top
    ``k`` (token, logprob) pairs, most likely first."""
    ranked = sorted((c["rank"], int(c["token_id"]), float(c["logprob"]))
                    for c in content.get("top_logprobs", [])
                    if c.get("rank") is not None and c["rank"] <= k)
    seen: set[int] = set()
    out = []
    for _, token, lp in ranked:
        if token not in seen:
            seen.add(token)
            out.append((token, lp))
    return out[:k]
