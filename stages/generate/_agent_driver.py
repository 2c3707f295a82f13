"""How :class:`stages.generate.agent.AgentEnv` runs a step's episodes: each episode's
record and outcome (:class:`AgentRun`), and the driver (:class:`AgentDriver`) that starts
the agents' threads, serves their turn-waves from the engine on the step's thread, one
engine call per wave, and closes the episodes that finish or run past their timeout.

A request the engine refuses fails alone: it is answered with the engine's reason and the
rest of its wave generated without it (see :meth:`AgentDriver._generate`).
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from gfcr.core.engine import Engine, GenRequest, RequestRefused, SamplingParams
from gfcr.core.stage import StepContext
from stages.generate._episodes import Episode
from stages.generate._waves import Ask, Waves
from stages.generate.openai_api import TOO_LONG, AgentServer
from stages.generate.rows import task_fields


class AgentSettings(Protocol):
    """What the driver reads of the stage's settings (AgentEnv's fields of those names)."""

    @property
    def label(self) -> str: ...

    @property
    def concurrency(self) -> int: ...

    @property
    def timeout(self) -> float: ...

    @property
    def temperature(self) -> float: ...

    @property
    def top_p(self) -> float: ...

    @property
    def max_tokens(self) -> int: ...


@dataclass
class AgentRun:
    """One episode: its task row, sample index, record and outcome."""

    task: int
    sample: int
    episode: Episode
    group: str
    """The task's group id: its rows' ``group_id``, and its requests' group on a fleet."""
    reward: float | None = None
    rewards: list[tuple[str, float]] | None = None
    """The reward's components, when the agent returned them."""
    error: str | None = None
    seconds: float = 0.0
    started: float = 0.0
    thread: threading.Thread | None = None
    finished: threading.Event = field(default_factory=threading.Event)
    closed: bool = False
    """Timed out: what the agent's thread does later is not recorded."""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def end(self) -> str:
        """Why the episode ended (gfcr.core.environment.EPISODE_ENDS)."""
        if self.error is None:
            return "done"
        return "env_timeout" if self.error.startswith("Timeout:") else "env_error"

    def settle(self, reward: float | None, error: str | None, *, close: bool = False,
               rewards: list[tuple[str, float]] | None = None) -> None:
        """Record the outcome, unless the episode was already closed by its timeout."""
        with self.lock:
            if not self.closed:
                self.reward, self.error, self.closed = reward, error, close
                self.rewards = rewards


class AgentDriver:
    """Runs a step's episodes: starts agent threads, serves their turn-waves from the
    engine on this thread, and closes episodes that finish or time out."""

    def __init__(self, spec: AgentSettings, ctx: StepContext, engine: Engine,
                 server: AgentServer, waves: Waves) -> None:
        self.spec, self.engine, self.server, self.waves = spec, engine, server, waves
        self.seeds = ctx.rng(spec.label)
        self.live: list[AgentRun] = []
        self.groups: dict[int, str] = {}  # episode index -> its task's group

    def run(self, runs: list[AgentRun], fn: Callable[..., Any], client: Any,
            tasks: list[dict[str, Any]]) -> None:
        todo = list(runs)
        while todo or self.live:
            while todo and len(self.live) < self.spec.concurrency:
                run = todo.pop(0)
                self._start(run, fn, client, task_fields(tasks[run.task]))
            wave = self.waves.gather(self._waiting, timeout=self._tick())
            if wave:
                self._serve(wave)
            self._reap()

    def _waiting(self) -> int:
        return sum(1 for r in self.live if not r.finished.is_set())

    def _tick(self) -> float:
        now = time.monotonic()
        return max(0.0, min((r.started + self.spec.timeout - now for r in self.live),
                            default=0.0))

    def _start(self, run: AgentRun, fn: Callable[..., Any], clients: Callable[[str], Any],
               task: dict[str, Any]) -> None:
        client = clients(self.server.open(run.episode))

        def body() -> None:
            try:
                reward, error, parts = _reward(fn(client, task))
                run.settle(reward, error, rewards=parts)
            except BaseException as err:  # noqa: BLE001 - the agent's error, recorded
                run.settle(None, f"{type(err).__name__}: {err}")
            finally:
                run.finished.set()
                self.waves.wake()

        self.groups[run.episode.index] = run.group
        run.started = time.monotonic()
        run.thread = threading.Thread(target=body, daemon=True,
                                      name=f"gfcr-agent-{run.episode.index}")
        self.live.append(run)
        run.thread.start()

    def _reap(self) -> None:
        now = time.monotonic()
        for run in list(self.live):
            if run.finished.is_set():
                run.seconds = now - run.started
            elif now - run.started >= self.spec.timeout:
                run.settle(None, f"Timeout: the agent ran past {self.spec.timeout:g} s "
                                 "(AgentEnv.timeout)", close=True)
                run.seconds = now - run.started
            else:
                continue
            self.server.end(run.episode, "the episode ended")
            self.live.remove(run)

    def _serve(self, wave: list[Ask]) -> None:
        """Generate a wave: one engine call per distinct ``stop`` of its asks (a request
        that cannot be rendered, or is too long, was answered by ``prepare``)."""
        ready = [(a, ids) for a in wave if (ids := self.server.prepare(a)) is not None]
        for stop in sorted({a.stop for a, _ in ready}):
            params = SamplingParams(temperature=self.spec.temperature, top_p=self.spec.top_p,
                                    max_tokens=self.spec.max_tokens, stop=stop,
                                    seed=int(self.seeds.integers(2**31 - 1)))
            self._generate([(a, ids) for a, ids in ready if a.stop == stop], params)

    def _generate(self, asks: list[tuple[Ask, list[int]]], params: SamplingParams) -> None:
        """One engine call for ``asks``; a request the engine refuses fails alone. The
        engine names it (:class:`RequestRefused`, a fleet server's HTTP 400): it is
        answered 400 and the rest generated again without it. Any other error splits
        the call in halves until the failing request is alone (one bad request costs
        its neighbours a retry, never their answers)."""
        asks = list(asks)
        while asks:
            requests = [GenRequest(key=i, prompt_ids=ids, max_tokens=a.max_tokens,
                                   group=self.groups.get(a.episode.index))
                        for i, (a, ids) in enumerate(asks)]
            try:
                outputs = self.engine.generate(requests, params)
            except RequestRefused as err:
                if not 0 <= err.key < len(asks):
                    raise
                asks.pop(err.key)[0].fail(400, f"the engine refused this request: "
                                               f"{str(err)[:500]}", _code(str(err)))
                continue
            except Exception as err:  # noqa: BLE001 - answered to the agent that caused it
                if len(asks) > 1:
                    half = len(asks) // 2
                    self._generate(asks[:half], params)
                    self._generate(asks[half:], params)
                else:
                    asks[0][0].fail(503, f"the engine failed on this request "
                                         f"({type(err).__name__})")
                return
            for (a, _), out in zip(asks, outputs):
                self.server.finish(a, out)
            return


def _code(message: str) -> str | None:
    """The API error code of an engine's refusal: a prompt longer than the context."""
    long = ("longer than the maximum", "maximum context length", "max_model_len")
    return TOO_LONG if any(phrase in message for phrase in long) else None


def _reward(value: Any) -> tuple[float | None, str | None, list[tuple[str, float]] | None]:
    """(reward, error, components): an agent returns a number, or (number, {name: value})
    to store the reward's components too."""
    parts: list[tuple[str, float]] | None = None
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], dict):
        value, named = value
        parts = [(str(k), float(v)) for k, v in named.items()]
    if isinstance(value, (int, float)) and math.isfinite(float(value)):
        return float(value), None, parts
    return None, f"the agent returned {value!r}, not a finite number", None
