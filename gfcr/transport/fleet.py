"""Generation on a fleet of the inference engine's own servers (issue 24).

A run names its fleet with :class:`Fleet` (the servers' URLs, each started with
``gfcr engine serve``) as its generate placement, and :class:`FleetGenerator` is then
its generator (gfcr.core.services.Generator): each generate call runs on the run's thread
(or, with ``max_staleness > 0``, on one thread behind it) through the engine config's
fleet engine (gfcr.core.capabilities.EngineFleet: vLLM's is stages.engines.fleet), which
splits the call's requests across the servers by group and sends them concurrently.
Nothing of Prefect is on this data path: a server is a vLLM HTTP server, a request a
POST, so a Prefect API restart loses nothing and a lost server loses only its requests
in flight, which go to the others.

Every generate stage runs on a fleet, the agentic ones included: ``Episodes`` and
``AgentEnv`` (stages.generate) make each turn-wave of a step's episodes one fleet call,
split by group (a task's episodes on one server, back on the server of their last turn
while the load stays fair), and render their conversations with the run's policy's
tokenizer and chat template (the fleet engine's ``tokenizer``), so nothing of vLLM runs
in the run's process. A multi-turn row's ``server`` is the server of its last policy turn.

Every call to a server carries the fleet's key (:attr:`Fleet.key_file`, or the file
``GFCR_FLEET_KEY_FILE`` names; gfcr.transport.fleet_gate checks it on the server).

Weights by version (:class:`gfcr.weights.versions.FileSync`): each version the learner hands out
is written once, in the engine's dtype, as a versioned folder (manifest last) under
``Fleet.weights`` (default: the run root's ``weights/RUN_ID``, which the servers must
read under their ``--weights-root``; each file's SHA-256 in the manifest), then every
server checks and loads it and labels it ``"<version>:<publication id>"`` from its
manifest; the labels vLLM puts on sampled tokens are checked against it, so every row's
``policy_version_*`` is the version that sampled its tokens. On GPUs the same protocol
fits an NCCL broadcast to the servers (stages.engines.fleet_nccl, untested here, and not
through gfcr's gate yet: it calls vLLM's development routes).
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any, Callable
from urllib.parse import urlsplit

import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field, field_validator

from gfcr.core.capabilities import EngineFleet, EngineSpec, WeightsDtype
from gfcr.core.services import Pending, WeightHandle, awake
from gfcr.core.stage import Generate, OnSegment, StepContext
from gfcr.core.settings import Sampled
from gfcr.evaluation.heldout import evaluate
from gfcr.runner.inprocess import generate_with
from gfcr.runner.serial import SerialCalls
from gfcr.weights.versions import FileSync, WeightStore, directory
from gfcr.transport.fleet_gate import fleet_key


class Fleet(BaseModel):
    """Where a run generates: vLLM servers started with ``gfcr engine serve``.

    >>> Fleet(urls=("http://gpu-a:8000", "http://gpu-b:8000")).attempts
    3
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    urls: tuple[str, ...] = Field(min_length=1)
    """The servers' base URLs (``http://host:port``), each listed once."""
    timeout_s: float = Field(300.0, gt=0.0)
    """A request's deadline: past it the request is aborted and sent to another server."""
    attempts: int = Field(3, ge=1)
    """Tries per request across the fleet before the run fails."""
    keep: int = Field(3, ge=2)
    """Published versions kept (at least ``max_staleness + 2`` in any case)."""
    weights: str | None = None
    """A folder the servers read published versions from (its ``RUN_ID`` subfolder);
    None: the run root's ``weights`` folder. It must be under each server's
    ``--weights-root``."""
    key_file: str | None = None
    """The fleet's key (the file each server was started with, ``gfcr engine serve
    --key-file``); None: the file ``GFCR_FLEET_KEY_FILE`` names, or no key (servers on
    loopback started without one)."""

    @field_validator("urls")
    @classmethod
    def _urls(cls, urls: tuple[str, ...]) -> tuple[str, ...]:
        return check_urls(urls)


def check_urls(urls: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """``urls`` as a fleet's servers (``http(s)://host:port``, no path, query or user,
    each once), without trailing slashes; ValueError naming the first bad one (``gfcr
    run --fleet`` checks them before any work)."""
    out: list[str] = []
    for url in urls:
        try:
            parts = urlsplit(url)
            parts.port  # a port that is not a number raises here
        except ValueError as err:
            raise ValueError(f"fleet URL {url!r} is malformed ({err}); expected "
                             f"http://HOST:PORT") from None
        extra = parts.path.strip("/") or parts.query or parts.fragment or parts.username
        if parts.scheme not in ("http", "https") or not parts.hostname or extra:
            raise ValueError(f"fleet URL {url!r} is not a server's base URL: expected "
                             f"http://HOST:PORT or https://HOST:PORT (no path, query or "
                             f"user), as `gfcr engine serve` prints")
        if url.rstrip("/") in out:
            raise ValueError(f"fleet URL {url.rstrip('/')!r} is listed twice: name each "
                             f"server once")
        out.append(url.rstrip("/"))
    return tuple(out)


def for_run(fleet: Fleet, pipeline: Any, run_id: str, root: Path, policy: Any,
            notify: Callable[[str], None]) -> "FleetGenerator":
    """The generator of ``run_id`` on ``fleet``; it generates nothing in this process."""
    spec = pipeline.engine
    if not isinstance(spec, EngineFleet):
        raise ValueError(f"placement fleet: engine {getattr(spec, 'type', spec)!r} cannot "
                         f"run as a fleet of servers; use engine=vllm (its servers are "
                         f"started with `gfcr engine serve`)")
    engine = spec.fleet(policy, list(fleet.urls), timeout_s=fleet.timeout_s,
                        attempts=fleet.attempts, notify=notify, key=fleet_key(fleet.key_file))
    where = Path(fleet.weights) / run_id if fleet.weights else directory(root, run_id)
    store = WeightStore(where, policy.io, keep=max(fleet.keep, pipeline.max_staleness + 2))
    dtype = spec.weights_dtype if isinstance(spec, WeightsDtype) else None
    capabilities = spec.capabilities if isinstance(spec, EngineSpec) else frozenset()
    if pipeline.max_staleness:  # the learner's policy runs ahead of the fleet's weights
        capabilities = capabilities - {"teacher_forcing"}
    return FleetGenerator(engine, FileSync(store, run_id, dtype), capabilities=capabilities,
                          background=bool(pipeline.max_staleness))


class FleetGenerator:
    """A fleet engine as the run's generator (see the module docstring). Calls run in
    submission order, each with the weights loaded before it was submitted: a load
    behind calls in flight is published at once (the learner may update again) and
    reaches the servers after those calls."""

    def __init__(self, engine: Any, sync: FileSync, *, capabilities: frozenset[str],
                 background: bool) -> None:
        self.engine, self.sync = engine, sync
        self._capabilities = capabilities
        self._calls = SerialCalls(background=background, name="gfcr-fleet-calls")
        self._loaded: int | None = None
        self.reloads: list[tuple[int, float]] = []
        """(version, seconds) of the fleet's reloads since the last step's metrics
        (publication excluded)."""
        self._sent = 0
        self.publish_s = 0.0  # writing versions since the last step's metrics

    @property
    def version(self) -> int:
        return int(self.engine.version) if self._loaded is None else self._loaded

    @property
    def capabilities(self) -> frozenset[str]:
        return self._capabilities

    def submit(self, ctx: StepContext, gen: Generate, plan: pa.Table,
               hooks: list[OnSegment]) -> Pending:
        return self._calls.run(lambda: self._generate(ctx, gen, plan, hooks))

    def _generate(self, ctx: StepContext, gen: Generate, plan: pa.Table,
                  hooks: list[OnSegment]) -> pa.Table:
        """``gen`` on the fleet; the fleet's errors name the stage and the step."""
        # getattr: a Generate is any object with generate(); gfcr's stages have a label
        label = getattr(gen, "label", type(gen).__name__)
        self.engine.caller = f"stage {label!r} at step {ctx.step}"
        return generate_with(self.engine, ctx, gen, plan, hooks)

    def load(self, handle: WeightHandle) -> None:
        """Publish ``handle`` now; the servers load it before the next call."""
        started = time.perf_counter()
        self.sync.send(handle)  # written once per version, in the engine's dtype
        self.publish_s += time.perf_counter() - started
        published = self.sync.store.get(handle.version)
        self._loaded = handle.version
        self._calls.run(lambda: self._reload(published.path, handle.version, published.ident))

    def _reload(self, path: Path, version: int, ident: str) -> None:
        seconds = self.engine.load(str(path.resolve()), version, ident)
        self.reloads.append((version, seconds))

    def evaluate(self, task: Any, prompts: pa.Table, *, handle: WeightHandle,
                 max_tokens: int, progress: Callable[[int, int], None] | None,
                 sampled: Sampled | None = None, seed: int = 0) -> dict[str, Any]:
        if handle.version != self.version:
            self.load(handle)
        self.drain()
        self.engine.caller = "the held-out evaluation"
        return evaluate(task, self.engine, prompts, max_tokens=max_tokens,
                        progress=progress, sampled=sampled, seed=seed)

    def asleep(self) -> contextlib.AbstractContextManager[None]:
        return awake()  # the servers hold their own accelerators

    def step_metrics(self, ctx: StepContext, rollouts: pa.Table) -> dict[str, float]:
        """Since the last step's metrics: requests sent, seconds writing versions and
        the servers' reloads; and the servers still live."""
        sent, self._sent = self.engine.requests - self._sent, self.engine.requests
        live = len(self.engine.servers) - len(self.engine.down)
        reload_s = sum(seconds for _, seconds in self.reloads)
        self.reloads = []
        metrics = {"fleet/requests": float(sent), "fleet/servers_live": float(live),
                   "fleet/publish_s": self.publish_s, "fleet/reload_s": reload_s}
        self.publish_s = 0.0
        return metrics

    def drain(self) -> None:
        """Wait until nothing submitted is still running."""
        self._calls.drain()

    def close(self) -> None:
        self._calls.close()
        self.engine.close()
