"""Multi-turn episodes: the policy talks with an environment, many episodes at once.

Each prompt of the plan is a task; ``n`` episodes run per task (a group, as in GRPO),
each with its own environment instance (:mod:`gfcr.core.environment`). A step runs in waves:
every live episode's conversation (token ids, :mod:`gfcr.chat.formats`) goes into ONE batched
engine call for the policy's next turn; then every live environment answers that turn
(concurrently, each call under ``env_timeout``); observations are appended as the ids of
their rendered delta. An episode ends when its environment says done, at ``max_turns``
policy turns, when the next turn would pass ``max_episode_tokens``, when a turn hits its
token cap and nothing is left, or when its environment raises or runs out of time; the
reason is its ``episode_end`` (:data:`gfcr.core.environment.EPISODE_ENDS`).

A row is one trajectory: ``turns`` holds every turn (the policy's with its logprobs and
in the loss, the environment's and tools' out of it), and the flat columns follow
``gfcr.core.rollout``'s rule (prompt: the first turn; completion: the rest). Its ``reward``
is the sum of its turns' rewards (None: no environment reward; then a Verify stage
scores it); an environment error is its ``score_error`` (reward 0 when the episode had
earned none), so the run goes on. This is the environment loop of verifiers/SkyRL
(Brown 2025; Cao et al. 2025, "SkyRL") with the token-in, token-out discipline of
:mod:`gfcr.chat.formats`.

On a fleet of servers (gfcr.transport.fleet) each turn-wave is one fleet call, split by
group (a task's episodes share a server), and a row's ``server`` is the server of its
last policy turn; the conversations are rendered with the run's policy's tokenizer.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import pyarrow as pa
from pydantic import Field, field_validator

from gfcr.chat.formats import chat_format
from gfcr.core.engine import Engine, GenOutput, GenRequest, SamplingParams, SegmentHook
from gfcr.core.environment import Environment, HasTools, Message, Step, resolve_env
from gfcr.core.rollout import (BRANCH, EPISODE_END, NEW_TOKENS, PLAN_MAX_TOKENS, PLAN_MAX_TURNS,
                               PLAN_N, ROLLOUT_SCHEMA, TURN_COUNT, col, stable_id)
from gfcr.core.trajectory import Trajectory
from gfcr.core.stage import OnSegment, StageSpec, StepContext
from gfcr.core.registry import register
from stages.generate._calls import CallOutcome, call_all
from stages.generate._policy import chat_tokenizer
from stages.generate.rows import GENERATED_SCHEMA, Made, plan_samples, rollout_row, to_table

EPISODES_SCHEMA = pa.schema(list(GENERATED_SCHEMA) + [pa.field(EPISODE_END, pa.string()),
                                                      pa.field(TURN_COUNT, pa.int32())])
"""What the stage returns: the rollout schema, ``new_tokens``, ``episode_end``, ``n_turns``."""


@dataclass
class EnvEpisode:
    """One episode in flight against its environment (an agent's episode is
    stages.generate._episodes.Episode)."""

    task: dict[str, Any]
    group_id: str
    sample_idx: int
    traj: Trajectory
    env: Environment | None = None
    end: str | None = None
    error: str | None = None
    outputs: list[GenOutput] = field(default_factory=list)
    limit: int = 1
    """Policy turns the episode may take in all (a branch's prefix counts)."""
    branch: dict[str, Any] | None = None
    """The plan's ``branch`` (gfcr.core.rollout.BRANCH): the stored turns it starts from."""


@register("generate")
class Episodes(StageSpec):
    """Run ``n`` episodes per task against an environment, in batched turn-waves.

    >>> Episodes(env="feedback", n=8, max_turns=3)  # doctest: +ELLIPSIS
    Episodes(name=None, type='episodes', env='feedback', ...)
    """

    type: Literal["episodes"] = "episodes"
    env: str
    """The environment: a registered name (``stages.envs``) or ``"module:Class"``."""
    env_options: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments of the environment's constructor."""
    n: int = Field(8, ge=1)
    """Episodes per task (the group), unless the plan's ``n`` column says otherwise."""
    temperature: float = Field(1.0, ge=0.0)
    """Sampling temperature of every policy turn; 0 is greedy."""
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    """Nucleus sampling mass; keep 1.0 for training (exact logprob ratios, gfcr.core.engine)."""
    max_turns: int = Field(4, ge=1)
    """Policy turns per episode."""
    max_tokens: int = Field(16, ge=1)
    """Tokens per policy turn, unless the plan's ``max_tokens`` column says otherwise."""
    max_episode_tokens: int = Field(256, ge=1)
    """Tokens after the first turn (policy, environment and tool tokens: what the learner
    sees as the completion); a turn that would pass it is not started."""
    env_timeout: float = Field(30.0, gt=0.0)
    """Seconds one ``reset`` or ``step`` call may take."""
    env_workers: int = Field(8, ge=1)
    """Environment calls run at once."""
    segment_tokens: int = Field(16, ge=1)
    """Tokens decoded per engine segment (no in-flight hook runs on episodes)."""
    continues_branches: ClassVar[bool] = True
    """It honours the plan's ``branch`` column (gfcr.core.capabilities.ContinuesBranches)."""

    writes: ClassVar[frozenset[str]] = (frozenset(ROLLOUT_SCHEMA.names) - {
        col.REWARDS, col.ADVANTAGE, col.CONSUMED_AT_STEP}) | {NEW_TOKENS, EPISODE_END,
                                                             TURN_COUNT}

    @field_validator("env")
    @classmethod
    def _known(cls, value: str) -> str:
        resolve_env(value)  # a name nobody registered, a module that does not load
        return value

    def sampling_temperature(self) -> float:
        return self.temperature

    def check_pipeline(self, stages: tuple[StageSpec, ...]) -> list[str]:
        """In-flight control hooks (APRIL, ARRoL, budgets) act on one engine call; an
        episode spans several, so they are refused here rather than silently ignored."""
        return [f"{self.label}: the in-flight control stage {s.label!r} cannot act on "
                f"multi-turn episodes (each turn is its own engine call); remove it"
                for s in stages if isinstance(s, OnSegment)]

    def plan_defaults(self) -> dict[str, int]:
        return {PLAN_N: self.n, PLAN_MAX_TOKENS: self.max_tokens}

    def generate(self, ctx: StepContext, plan: pa.Table, engine: Engine,
                 on_segment: SegmentHook | None) -> pa.Table:
        episodes = self._start(ctx, plan.to_pylist(), engine)
        seed = int(ctx.rng(self.label).integers(2**31 - 1))
        for turn in range(max((e.limit for e in episodes), default=0)):
            live = [e for e in episodes if e.end is None]
            if not live:
                break
            self._policy_turn(live, engine, seed + turn)
            self._env_turn(live, engine)
        return to_table([self._row(ctx, e, engine) for e in episodes], EPISODES_SCHEMA)

    def _start(self, ctx: StepContext, prompts: list[dict[str, Any]], engine: Engine
               ) -> list[EnvEpisode]:
        """One episode per sample, its environment made and reset (concurrently)."""
        fmt = chat_format(chat_tokenizer(engine, self.label))
        factory = resolve_env(self.env)
        episodes = []
        for p_idx, prompt in enumerate(prompts):
            group_id = (prompt.get(col.GROUP_ID)
                        or stable_id(ctx.run_id, ctx.step, ctx.round, "group", p_idx))
            branch = prompt.get(BRANCH)
            limit = int(prompt.get(PLAN_MAX_TURNS) or self.max_turns)
            for sample in plan_samples({**prompt, "recycle": None}, self.n):
                episodes.append(EnvEpisode(_task(prompt), group_id, sample["sample_idx"],
                                        Trajectory(fmt), limit=limit, branch=branch))

        def reset(e: EnvEpisode) -> tuple[Environment, list[Message], list[Any]]:
            env = factory(**self.env_options)
            messages = env.reset(e.task)
            for t in (e.branch or {}).get("turns") or []:  # the branch's state, replayed
                if t["source"] == "policy":
                    env.step(engine.decode(t["token_ids"]))
            return env, messages, env.tools() if isinstance(env, HasTools) else []

        outcomes = call_all([lambda e=e: reset(e) for e in episodes],  # type: ignore[misc]
                            timeout=self.env_timeout, workers=self.env_workers)
        for e, o in zip(episodes, outcomes):
            if not _failed(e, o, "reset"):
                try:  # the first messages and tools may not render
                    e.env, messages, tools = o.value
                    if e.branch is None:
                        e.traj.start(messages, tools)
                    else:
                        e.traj = Trajectory.of_rows(e.branch["turns"], e.traj.format)
                    continue
                except Exception as err:  # noqa: BLE001 - user code's output: recorded
                    _invalid(e, "reset", err)
            e.traj.turns.clear()
            e.traj.start([Message("user", e.task["prompt"])])
        return episodes

    def _policy_turn(self, live: list[EnvEpisode], engine: Engine, seed: int) -> None:
        """One batched engine call: every live episode's next policy turn."""
        requests = []
        for key, e in enumerate(live):
            cap = e.task.get(PLAN_MAX_TOKENS) or self.max_tokens
            room = self.max_episode_tokens - len(e.traj.completion_ids)
            requests.append(GenRequest(key=key, prompt_ids=e.traj.ids(),
                                       max_tokens=max(1, min(int(cap), room)),
                                       group=e.group_id))
        params = SamplingParams(temperature=self.temperature, top_p=self.top_p,
                                max_tokens=self.max_tokens, seed=seed,
                                segment_tokens=self.segment_tokens)
        for e, out in zip(live, engine.generate(requests, params)):
            e.traj.add_policy(out.completion_ids, out.logprobs)
            e.outputs.append(out)

    def _env_turn(self, live: list[EnvEpisode], engine: Engine) -> None:
        """Every live environment answers its policy's turn (as text); episodes end or
        go on."""
        replies = [engine.decode(e.traj.turns[-1].token_ids) for e in live]

        def step(e: EnvEpisode, reply: str) -> Step:
            assert e.env is not None
            return e.env.step(reply)

        outcomes = call_all([lambda e=e, r=r: step(e, r)  # type: ignore[misc]
                             for e, r in zip(live, replies)],
                            timeout=self.env_timeout, workers=self.env_workers)
        for e, o in zip(live, outcomes):
            if _failed(e, o, "step"):
                continue
            try:  # what the environment returned may not be a Step of messages
                e.traj.reward_last(o.value.reward)
                last = sum(t.source == "policy" for t in e.traj.turns) >= e.limit
                self._go_on(e, o.value, last)
            except Exception as err:  # noqa: BLE001 - user code's output: recorded
                _invalid(e, "step", err)

    def _go_on(self, e: EnvEpisode, result: Step, last: bool) -> None:
        """After the environment's answer: end the episode, or append its observation."""
        if result.done:
            e.end = "done"
        elif last:
            e.end = "turn_limit"
        else:
            before = len(e.traj.turns)
            e.traj.observe(result.messages, tool_name=result.tool_name,
                           tool_error=result.tool_error)
            if len(e.traj.completion_ids) >= self.max_episode_tokens:
                del e.traj.turns[before:]  # no room for a reply: the observation is moot
                e.end = "token_limit"
        if e.end is not None and e.traj.turns[-1].source == "policy":
            # ended without its observation: the call's tool and error stay on the turn
            e.traj.turns[-1].tool_name = result.tool_name
            e.traj.turns[-1].tool_error = result.tool_error

    def _row(self, ctx: StepContext, e: EnvEpisode, engine: Engine) -> dict[str, Any]:
        reward = e.traj.reward()
        row = rollout_row(ctx, e.task["row"], e.group_id, e.sample_idx, e.traj,
                          Made.by(e.outputs, engine), engine,
                          parent_id=(e.branch or {}).get("parent_id"), score_error=e.error,
                          reward=0.0 if reward is None and e.error else reward)
        return {**row, EPISODE_END: e.end or "turn_limit", TURN_COUNT: len(e.outputs)}


def _task(prompt: dict[str, Any]) -> dict[str, Any]:
    """The task row an environment's ``reset`` sees: the prompt's fields, ``meta``
    parsed from JSON, and the plan row itself under ``row``."""
    meta = prompt.get(col.META)
    try:
        parsed = json.loads(meta) if isinstance(meta, str) else meta
    except json.JSONDecodeError:
        parsed = meta
    return {col.PROMPT: prompt[col.PROMPT], col.ANSWER: prompt.get(col.ANSWER),
            col.META: parsed, col.TASK: prompt.get(col.TASK),
            col.PROMPT_ID: prompt.get(col.PROMPT_ID),
            PLAN_MAX_TOKENS: prompt.get(PLAN_MAX_TOKENS), "row": prompt}


def _failed(e: EnvEpisode, o: CallOutcome, call: str) -> bool:
    """Record an environment's failure on its episode; whether it failed."""
    if o.timed_out:
        e.end, e.error = "env_timeout", f"EnvTimeout: {call} took longer than the limit"
    elif o.error is not None:
        e.end = "env_error"
        e.error = f"EnvError: {call} raised {type(o.error).__name__}: {o.error}"
    return e.end in ("env_timeout", "env_error")


def _invalid(e: EnvEpisode, call: str, err: Exception) -> None:
    """An environment's answer that cannot be used ends its episode, recorded."""
    e.end = "env_error"
    e.error = (f"EnvError: {call} returned what cannot be appended to the conversation "
               f"({type(err).__name__}: {err})")

