"""The vLLM engine as a fleet of vLLM's own servers (gfcr.core.engine.Engine over HTTP).

A generate call is split across the servers by group (a GRPO group's samples share a
server, so they share its prefix cache; so do a task's episodes, whose requests name
their group, :attr:`gfcr.core.engine.GenRequest.group`); every request goes out at once,
each on a thread of its own, and its tokens come back as the server finishes it. A group
the previous call placed goes back to the same server while that keeps the load fair, so
an episode's next turn finds its conversation so far in that server's prefix cache. Token ids go in
and out (vLLM's ``/inference/v1/generate``), so nothing is decoded and encoded again:
the tokens and logprobs stored are the ones vLLM sampled.

In-flight control is the in-process vLLM engine's (stages.engines._vllm_run): with a
segment hook each request generates ``segment_tokens`` at a time and the next segment is
a new request from prompt + tokens so far; the hook sees the whole call between
segments, so APRIL, ARRoL and TokenBudget stop and prune across the fleet as on one
engine. A stopped group is recycled by the Replay stage, as always.

Weights by version: :meth:`FleetEngine.load` has every server load a published version
(gfcr.weights.versions) through gfcr's gate and worker extension, which check it, drop the
prefix cache and label the weights ``"<version>:<publication id>"`` from its manifest (a
server whose label is not the version published is out). Every call carries the fleet's
``key`` (gfcr.transport.fleet_gate). vLLM tags every sampled token with the label
it was sampled under, so a row's version is checked, not assumed: tokens under another
label are never used (the request is sent again after the server is reloaded).

Liveness: each request has a deadline (``timeout_s``) and at most ``attempts`` tries
across the fleet; a request that failed or passed its deadline is aborted on its server
and sent to another, and a server that fails is taken out of the fleet until it answers
again (checked at each call, and reloaded then if it holds other weights). A call that no
server can serve raises :class:`FleetDown` naming every server and what it said.
"""

from __future__ import annotations

import secrets
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any, Callable

from gfcr.core.engine import (GenOutput, GenRequest, RequestRefused, SamplingParams, SegmentHook,
                              encode_prompt, stop_token_ids)
from gfcr.core.policy import Policy
from stages.engines import teacher
from stages.engines._fleet_client import Completion, Server, ServerError
from stages.engines._seqs import Seq, ask_hook, check_keys, context_of, new_seq, output
from stages.engines._vllm_run import _append


class FleetDown(RuntimeError):
    """No server of the fleet could serve a request; the message names each server."""


class FleetEngine:
    """gfcr's Engine over vLLM servers at ``urls`` (see the module docstring); the
    policy supplies the tokenizer (and teacher-forced logprobs) in this process."""

    def __init__(self, policy: Policy, urls: list[str], *, timeout_s: float = 300.0,
                 attempts: int = 3, notify: Callable[[str], None] | None = None,
                 key: bytes | None = None) -> None:
        self._policy = policy
        self.servers = [Server(u, timeout_s=timeout_s, key=key) for u in urls]
        self.attempts = attempts
        self.notify = notify or (lambda message: None)
        self.down: dict[str, str] = {}
        """Server URL -> why it is out of the fleet."""
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max(8, 32 * len(urls)),
                                        thread_name_prefix="gfcr-fleet")
        self._version = policy.version
        self._label: str | None = None  # None: the weights the servers started with
        self._folder: str | None = None
        self.requests = 0  # requests sent (for dispatch-cost measurements)
        self._homes: dict[Any, str] = {}  # group -> server URL, as the last call placed it
        self.caller = "a generate call"
        """Who calls (the run's generator names the stage and step): errors name it."""

    @property
    def version(self) -> int:
        return self._version

    @property
    def label(self) -> str | None:
        return self._label

    @property
    def tokenizer(self) -> Any:
        """The run's policy's tokenizer (and chat template): the agentic stages render
        conversations with it here, so nothing of vLLM's is needed in this process."""
        return self._policy.tokenizer

    def context_length(self) -> int | None:
        """The policy's context (gfcr.core.capabilities.ContextLength)."""
        return context_of(self._policy.model)

    def encode(self, text: str) -> list[int]:
        return self._policy.tokenizer.encode(text)

    def encode_prompt(self, text: str) -> list[int]:
        return encode_prompt(self._policy.tokenizer, text)

    def decode(self, ids: list[int]) -> str:
        return self._policy.tokenizer.decode(ids)

    def forced_logprobs(self, prompt_ids: list[int], ids: list[int],
                        temperature: float) -> list[float]:
        """Teacher-forced logprobs on the learner's policy in this process (the fleet's
        weights in a synchronous run)."""
        return teacher.forced_logprobs(self._policy, prompt_ids, ids, temperature)

    def update_weights(self, state: Any | None = None) -> int:
        raise TypeError("a fleet of vLLM servers loads published versions "
                        "(FleetEngine.load), not a state dict")

    # ------------------------------------------------------------------ weights

    def load(self, folder: str, version: int, ident: str) -> float:
        """Every live server loads the version published in ``folder`` (concurrently);
        one that fails is taken out of the fleet. Returns the seconds it took."""
        started = time.perf_counter()
        self._folder, self._label, self._version = folder, f"{version}:{ident}", version
        live = self._live()
        list(self._pool.map(self._reload, live))
        if not self._live():
            raise FleetDown(self._why("no server loaded version " + str(version)))
        return time.perf_counter() - started

    def _reload(self, server: Server) -> None:
        if self._folder is None or self._label is None:
            return
        try:
            server.load(self._folder, self._label)
        except ServerError as err:
            self._out(server, str(err))

    def check(self) -> None:
        """Bring back servers that answer again and reload any that hold other weights
        than the fleet's (a restarted server holds the ones it started with): a server
        is used only with the fleet's version."""
        for server in self.servers:
            if server.url in self.down and not server.healthy():
                continue
            try:
                held = server.label()
            except ServerError as err:
                self._out(server, str(err))
                continue
            if self._label is not None and held != self._label:
                self.notify(f"vLLM server {server.url} holds weights {held!r}, not the "
                            f"fleet's {self._label!r}: reloading it")
                self._reload(server)
            if server.url in self.down and self._holds(server):
                self.notify(f"vLLM server {server.url} is back in the fleet")
                with self._lock:
                    self.down.pop(server.url, None)

    def _holds(self, server: Server) -> bool:
        try:
            return self._label is None or server.label() == self._label
        except ServerError:
            return False

    # ------------------------------------------------------------------ generation

    def generate(self, requests: list[GenRequest], params: SamplingParams,
                 on_segment: SegmentHook | None = None) -> list[GenOutput]:
        """Generate every request across the fleet; outputs in request order."""
        t0 = time.perf_counter()
        check_keys(requests)
        self.check()
        seqs = [new_seq(r, params) for r in requests]
        if on_segment is not None:
            on_segment.wave([s.req.key for s in seqs])  # one wave: every request at once
        owner = self._assign(seqs, on_segment)
        served: dict[int, str] = {}
        tag = secrets.token_hex(4)
        while True:
            live = [s for s in seqs if s.reason is None]
            if not live:
                break
            step = params.segment_tokens if on_segment is not None else None
            self._segment(live, params, step, owner, served, tag, t0)
            if on_segment is not None:
                ask_hook(on_segment, [s for s in live if s.reason is None],
                         time.perf_counter() - t0)
        return [replace(output(s, self._version, params), server=served.get(s.req.key))
                for s in seqs]

    def _assign(self, seqs: list[Seq], hook: SegmentHook | None) -> dict[int, Server]:
        """Request key -> its server: whole groups (the hook's, else the request's own
        ``group``, else requests of one prompt), each to the server the previous call
        gave it if that server is live and stays within its fair share, else to the live
        server with the fewest requests so far."""
        # getattr: gfcr.runner.inprocess.SegmentHooks keeps the call's groups; others may not
        flight = getattr(hook, "flight", None)
        groups: dict[Any, list[Seq]] = {}
        for s in seqs:
            key = flight.groups.get(s.req.key) if flight is not None else None
            groups.setdefault(key or s.req.group or tuple(s.req.prompt_ids), []).append(s)
        live = self._live()
        if not live:
            raise FleetDown(self._why("no server is live"))
        load = {server.url: 0 for server in live}
        fair = -(-len(seqs) // len(live))  # ceil: requests per server
        owner: dict[int, Server] = {}
        homes: dict[Any, str] = {}
        for group, members in groups.items():
            home = next((x for x in live if x.url == self._homes.get(group)), None)
            if home is None or load[home.url] + len(members) > fair:
                home = min(live, key=lambda x: load[x.url])
            load[home.url] += len(members)
            homes[group] = home.url
            for s in members:
                owner[s.req.key] = home
        self._homes = homes
        return owner

    def _segment(self, live: list[Seq], params: SamplingParams, step: int | None,
                 owner: dict[int, Server], served: dict[int, str], tag: str,
                 t0: float) -> None:
        """One request per live sequence, all at once, at most ``step`` new tokens each."""
        ends = stop_token_ids(self._policy.tokenizer)
        jobs = []
        for s in live:
            room = s.budget - len(s.ids)
            sampling = dict(temperature=params.temperature, top_p=params.top_p,
                            max_tokens=room if step is None else min(step, room),
                            logprobs=params.top_logprobs, stop_token_ids=sorted(ends),
                            ignore_eos=False, skip_special_tokens=False)
            ids = s.req.prompt_ids + s.req.prefix_ids + s.ids
            rid = f"{tag}-{s.req.key}-{len(s.ids)}"
            jobs.append((s, self._pool.submit(self._send, rid, ids, sampling, owner,
                                              s.req.key)))
        for s, job in jobs:
            done, url = job.result()
            _append(s, done.token_ids, done.logprobs, done.tops or [[]] * len(done.token_ids),
                    ends, params.stop, self.decode)
            served[s.req.key] = url
            if s.reason is not None:
                s.seconds = time.perf_counter() - t0

    def _send(self, rid: str, ids: list[int], sampling: dict[str, Any],
              owner: dict[int, Server], key: int) -> tuple[Completion, str]:
        """One request, on its server or, after a failure, another; at most
        ``attempts`` tries, each with the server's deadline."""
        errors: list[str] = []
        tried: set[str] = set()
        for attempt in range(self.attempts):
            server = self._server_for(owner, key, tried)
            tried.add(server.url)
            name = f"{rid}-{attempt}"
            with self._lock:
                self.requests += 1
            try:
                done = server.generate(name, ids, sampling)
            except ServerError as err:
                if err.why.startswith("HTTP 4"):  # the request's fault: no retry helps
                    raise RequestRefused(key, f"the fleet refused request {rid} of "
                                              f"{self.caller}: {err}") from None
                server.abort([name])  # superseded: its deadline passed or it broke
                errors.append(str(err))
                self._out(server, str(err))
                continue
            if self._label is not None and set(done.versions) - {self._label}:
                errors.append(f"{server.url} sampled under {sorted(set(done.versions))}, "
                              f"not {self._label!r}")
                self._reload(server)  # never use stale tokens: reload, send again
                continue
            if not done.token_ids:  # aborted on the server before its first token
                errors.append(f"{server.url} returned no tokens ({done.finish_reason})")
                continue
            return done, server.url
        raise FleetDown(self._why(f"request {rid} failed {self.attempts} times: "
                                  + " | ".join(errors)))

    def _server_for(self, owner: dict[int, Server], key: int, tried: set[str]) -> Server:
        """The request's server; after a failure there (down, or slower than its
        deadline: a straggler), a live one it has not tried, if any."""
        server = owner[key]
        if server.url not in self.down and server.url not in tried:
            return server
        live = self._live()
        if not live:
            raise FleetDown(self._why("no server is left"))
        fresh = [s for s in live if s.url not in tried] or live
        moved = fresh[key % len(fresh)]
        owner[key] = moved  # the rest of its segments go there too
        return moved

    def _live(self) -> list[Server]:
        with self._lock:
            return [s for s in self.servers if s.url not in self.down]

    def _out(self, server: Server, why: str) -> None:
        """Take ``server`` out of the fleet unless it still answers its health check."""
        if server.healthy():
            return
        with self._lock:
            first = server.url not in self.down
            self.down[server.url] = why
        if first:
            self.notify(f"vLLM server {server.url} is out of the fleet: {why}")

    def _why(self, what: str) -> str:
        states = [f"{s.url}: {self.down.get(s.url, 'live')}" for s in self.servers]
        return (f"the fleet cannot serve {self.caller}: {what}. Servers: "
                + "; ".join(states))

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        for server in self.servers:
            server.close()
