"""AgentEnv: any agent written against the ``openai`` client, as a generate stage.

The user writes ``def solve(client: openai.OpenAI, task: dict) -> float`` and names it
``AgentEnv(agent="mymodule:solve", n=8)`` in the place of the generate stage. For each
task row and each of its ``n`` samples, gfcr calls ``solve`` on a thread with a client
whose base URL is gfcr's OpenAI-compatible endpoint over the step's policy
(:mod:`stages.generate.openai_api`) and the task's fields (``prompt`` and ``question``:
its text; ``answer``; ``meta``, parsed from JSON; ``task``; ``prompt_id``). What ``solve``
returns is the rollout's reward, so the pipeline needs no Verify stage; it may return
``(reward, {name: value})`` to store the reward's components (the ``rewards`` column) too.

Every call's prompt ids, generated ids and logprobs are recorded, and the episode's calls
become trajectories (:mod:`stages.generate._episodes`): a call that extends the previous
context is the next turn of the same row (the environment's or tool's tokens out of the
loss, the policy's in it with their logprobs), one that does not starts a branch, a new
row whose ``parent_id`` is the row it shares the longest prefix with. Every row of an
episode carries the episode's reward, and all rows of a task's episodes share one group,
so GRPO's group baseline counts a branched episode once per branch (a choice: weighting
branches by 1/branches would be the alternative).

On a fleet of servers (gfcr.transport.fleet) each turn-wave is one fleet call, split by
task (a task's episodes share a server), and a row's ``server`` is the server of its last
policy turn; the endpoint renders and decodes with the run's policy's tokenizer.

A plan's ``n`` column sets a task's episodes and its ``max_tokens`` column the task's cap
per call (Control stages that allocate them work unchanged).

An agent that raises, returns something other than a finite number, or runs past
``timeout`` is recorded in ``score_error`` (reward 0, or the rows dropped:
``on_error``), and the step goes on; a step on which every episode failed stops the run,
as Verify does for scorers. A hung agent's thread cannot be killed: its episode is
closed (the endpoint refuses its calls) and the thread is left to end on its own.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Iterator, Literal

import pyarrow as pa
from pydantic import Field, field_validator

from gfcr.config import refs
from gfcr.chat.formats import chat_format
from gfcr.core.engine import Engine, GenRequest, RequestRefused, SamplingParams, SegmentHook
from gfcr.core.rollout import EPISODE_END, PLAN_MAX_TOKENS, PLAN_N, TURN_COUNT, col
from gfcr.core.stage import StageSpec, StepContext
from gfcr.core.registry import register
from stages.endpoint._limits import context_limit, max_token_chars
from stages.endpoint._openai_chat import OpenAIChat
from stages.generate._episodes import Episode
from stages.generate._policy import chat_tokenizer
from stages.generate.group import GENERATED
from stages.generate.openai_api import TOO_LONG, AgentServer
from stages.generate.rows import episode_rows, stable_id, task_fields, to_table
from stages.generate._waves import Ask, Waves


class AgentFailed(RuntimeError):
    """Every episode of a step failed: the run stops (the steps committed stay)."""


@register("generate")
class AgentEnv(StageSpec):
    """Episodes of a user's ``openai``-client agent, served by the policy (see the module
    docstring); its return value is the reward.

    >>> AgentEnv(agent="examples.agent_calculator:solve", n=4)  # doctest: +ELLIPSIS
    AgentEnv(name=None, type='agent', agent='examples.agent_calculator:solve', n=4, ...)
    """

    type: Literal["agent"] = "agent"
    agent: str
    """``module:function``: ``function(client: openai.OpenAI, task: dict) -> float``."""
    n: int = Field(8, ge=1)
    """Episodes per task row (the group), unless the plan's ``n`` column says otherwise."""
    temperature: float = Field(1.0, ge=0.0)
    """Sampling temperature of every call (a request's own is ignored)."""
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    """Nucleus sampling mass; keep 1.0 for training (exact logprob ratios, gfcr.core.engine)."""
    max_tokens: int = Field(64, ge=1)
    """Most tokens one call generates (a request may ask for fewer)."""
    max_calls: int = Field(32, ge=1)
    """Most chat calls an episode may make; the endpoint refuses the ones after."""
    timeout: float = Field(120.0, gt=0.0)
    """Seconds an episode may run; past it, it is recorded as timed out."""
    concurrency: int = Field(64, ge=1)
    """Episodes running at once; the rest start as they end."""
    window: float = Field(0.05, ge=0.0, le=10.0)
    """Seconds a turn-wave waits for more calls once one arrived (it closes at once when
    every running episode is waiting on the model)."""
    on_error: Literal["zero", "drop"] = "zero"
    """A failed episode's rows: reward 0 (kept), or dropped (kept = false)."""
    max_context: int | None = Field(None, ge=2)
    """Most tokens a call's prompt and answer may hold; None: the policy's context
    (``max_position_embeddings``). A longer conversation is refused (HTTP 400
    ``context_length_exceeded``) before it is rendered, for that call alone; on a fleet,
    a server's shorter ``--max-model-len`` refuses it there, for that call alone too."""
    max_connections: int = Field(128, ge=1)
    """Connections the endpoint serves at once (one thread each); more are refused (503)."""
    read_timeout: float = Field(60.0, gt=0.0)
    """Seconds a connection may send nothing (idle, or mid-request) before it is closed."""

    writes: ClassVar[frozenset[str]] = GENERATED | {col.REWARD, col.SCORE_ERROR, EPISODE_END,
                                                    TURN_COUNT}

    @field_validator("agent")
    @classmethod
    def _a_reference(cls, value: str) -> str:
        if not refs.REF.fullmatch(value):
            raise ValueError(f"agent={value!r} must name a function as 'module:function'")
        return value

    def sampling_temperature(self) -> float:
        return self.temperature

    def plan_defaults(self) -> dict[str, int]:
        return {PLAN_N: self.n, PLAN_MAX_TOKENS: self.max_tokens}

    def generate(self, ctx: StepContext, plan: pa.Table, engine: Engine,
                 on_segment: SegmentHook | None) -> pa.Table:
        fn = self.agent_function()
        tasks = plan.to_pylist()
        tokenizer = chat_tokenizer(engine, self.label)
        chat = chat_format(tokenizer)
        codec = OpenAIChat(chat)
        runs: list[_AgentRun] = []
        for p_idx, prompt in enumerate(tasks):
            cap = None if prompt.get(PLAN_MAX_TOKENS) is None else int(prompt[PLAN_MAX_TOKENS])
            group = stable_id(ctx.run_id, ctx.step, ctx.round, "group", p_idx)
            for sample in range(_n(prompt, self.n)):
                runs.append(_AgentRun(p_idx, sample, Episode(len(runs), codec, max_tokens=cap),
                                 group))
        waves = Waves(self.window)
        with AgentServer(waves, engine.decode, model=self.label, max_tokens=self.max_tokens,
                         wait=self.timeout, max_calls=self.max_calls,
                         context=context_limit(engine, self.max_context),
                         token_chars=max_token_chars(tokenizer),
                         max_connections=self.max_connections,
                         read_timeout=self.read_timeout) as server, \
                _clients(self.label, self.timeout) as client:
            _Driver(self, ctx, engine, server, waves).run(runs, fn, client, tasks)
        return self._table(ctx, tasks, runs, engine)

    def agent_function(self) -> Callable[..., Any]:
        """The function each episode runs (a subclass may supply its own)."""
        return _agent(self.agent, f"stage {self.label!r}: agent")

    def _table(self, ctx: StepContext, tasks: list[dict[str, Any]], runs: list["_AgentRun"],
               engine: Engine) -> pa.Table:
        rows: list[dict[str, Any]] = []
        ends: list[str] = []
        for run in runs:
            episode, prompt = run.episode, tasks[run.task]
            with episode.lock:
                calls = [(c.exchange(), c.output) for c in episode.calls if c.output is not None]
            more = episode_rows(ctx, prompt, run.group, run.sample, calls,
                                lambda: episode.codec.render(
                                    [{"role": "user", "content": prompt[col.PROMPT]}], None),
                                engine, reward=run.reward, error=run.error, seconds=run.seconds)
            for row in more:
                row[col.REWARDS] = run.rewards
            rows += more
            ends += [run.end()] * len(more)
        failed = [r for r in runs if r.error is not None]
        if runs and len(failed) == len(runs):
            raise AgentFailed(f"stage {self.label!r}, step {ctx.step}: the agent "
                              f"{self.agent!r} failed on all {len(runs)} episodes (first: "
                              f"{failed[0].error}); the run stops. Fix the agent, then "
                              f"resume (gfcr run --resume {ctx.run_id}).")
        if self.on_error == "drop":
            for row in rows:
                if row[col.SCORE_ERROR] is not None:
                    row.update({col.KEPT: False, col.DROPPED_BY: self.label,
                                col.DROP_REASON: "agent_error"})
        turns = [sum(t["source"] == "policy" for t in r[col.TURNS]) for r in rows]
        return (to_table(rows).append_column(EPISODE_END, pa.array(ends, pa.string()))
                .append_column(TURN_COUNT, pa.array(turns, pa.int32())))


@dataclass
class _AgentRun:
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


class _Driver:
    """Runs a step's episodes: starts agent threads, serves their turn-waves from the
    engine on this thread, and closes episodes that finish or time out."""

    def __init__(self, spec: AgentEnv, ctx: StepContext, engine: Engine,
                 server: AgentServer, waves: Waves) -> None:
        self.spec, self.engine, self.server, self.waves = spec, engine, server, waves
        self.seeds = ctx.rng(spec.label)
        self.live: list[_AgentRun] = []
        self.groups: dict[int, str] = {}  # episode index -> its task's group

    def run(self, runs: list[_AgentRun], fn: Callable[..., Any], client: Any,
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

    def _start(self, run: _AgentRun, fn: Callable[..., Any], clients: Callable[[str], Any],
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


def _agent(ref: str, what: str) -> Callable[..., Any]:
    """The agent function; a module not found on ``sys.path`` is looked for in the
    working directory too, as ``python -m`` and uvicorn do (``gfcr run`` is a console
    script, whose path starts at its own folder)."""
    try:
        found = refs.resolve(ref, what)
    except ValueError:
        if os.getcwd() in sys.path:
            raise
        sys.path.append(os.getcwd())
        found = refs.resolve(ref, what)
    if not callable(found):
        raise ValueError(f"{what} {ref!r} is not a function")
    return found


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


def _n(prompt: dict[str, Any], default: int) -> int:
    return default if prompt.get(PLAN_N) is None else int(prompt[PLAN_N])


@contextlib.contextmanager
def _clients(label: str, timeout: float) -> Iterator[Callable[[str], Any]]:
    """Makes each episode's ``openai.OpenAI`` client. They share one HTTP connection
    pool for the step (a client of its own costs ~0.1 s to build, its TLS set-up, which
    was most of a one-call episode's cost); an agent closing its client leaves the pool
    open for the others."""
    try:
        import openai
    except ImportError:
        raise ImportError(f"stage {label!r} (AgentEnv) hands the agent an openai.OpenAI "
                          "client: install the openai package (pip install openai)") from None

    class Shared(openai.DefaultHttpxClient):
        def close(self) -> None:
            """Kept open: the step closes it (``really_close``)."""

        def really_close(self) -> None:
            super().close()

    http = Shared(timeout=timeout, trust_env=False)  # openai's connection limits (1,000)
    try:
        yield lambda url: openai.OpenAI(base_url=url, api_key="gfcr", max_retries=0,
                                        timeout=timeout, http_client=http)
    finally:
        http.really_close()

