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
import os
import sys
from typing import Any, Callable, ClassVar, Iterator, Literal

import pyarrow as pa
from pydantic import Field, field_validator

from gfcr.config import refs
from gfcr.chat.formats import chat_format
from gfcr.core.engine import Engine, SegmentHook
from gfcr.core.rollout import EPISODE_END, PLAN_MAX_TOKENS, PLAN_N, TURN_COUNT, col
from gfcr.core.stage import StageSpec, StepContext
from gfcr.core.registry import register
from stages.endpoint._limits import context_limit, max_token_chars
from stages.endpoint._openai_chat import OpenAIChat
from stages.generate._agent_driver import AgentDriver, AgentRun
from stages.generate._episodes import Episode
from stages.generate._policy import chat_tokenizer
from stages.generate.group import GENERATED
from stages.generate.openai_api import AgentServer
from stages.generate.rows import episode_rows, stable_id, to_table
from stages.generate._waves import Waves


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
        runs: list[AgentRun] = []
        for p_idx, prompt in enumerate(tasks):
            cap = None if prompt.get(PLAN_MAX_TOKENS) is None else int(prompt[PLAN_MAX_TOKENS])
            group = stable_id(ctx.run_id, ctx.step, ctx.round, "group", p_idx)
            for sample in range(_n(prompt, self.n)):
                runs.append(AgentRun(p_idx, sample, Episode(len(runs), codec, max_tokens=cap),
                                group))
        waves = Waves(self.window)
        with AgentServer(waves, engine.decode, model=self.label, max_tokens=self.max_tokens,
                         wait=self.timeout, max_calls=self.max_calls,
                         context=context_limit(engine, self.max_context),
                         token_chars=max_token_chars(tokenizer),
                         max_connections=self.max_connections,
                         read_timeout=self.read_timeout) as server, \
                _clients(self.label, self.timeout) as client:
            AgentDriver(self, ctx, engine, server, waves).run(runs, fn, client, tasks)
        return self._table(ctx, tasks, runs, engine)

    def agent_function(self) -> Callable[..., Any]:
        """The function each episode runs (a subclass may supply its own)."""
        return _agent(self.agent, f"stage {self.label!r}: agent")

    def _table(self, ctx: StepContext, tasks: list[dict[str, Any]], runs: list[AgentRun],
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

