"""The services in this process (gfcr.core.services): an engine, the train stage's learner and
the filter stages, as a run has always driven them.

The learner owns the policy. In a synchronous run the engine shares the policy's module
(HF) or copies from it (vLLM), so a load after an update moves nothing or copies in
place. In an asynchronous run (``max_staleness > 0``) the engine generates on a thread
of its own while the learner updates, so it holds its own policy, into which each load
copies the learner's tensors (:class:`LocalGenerator`).
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterator

import pyarrow as pa

from gfcr.core.capabilities import AdapterWeights, EngineRng, EngineSleep
from gfcr.core.engine import Decision, Engine, Flight, Inflight
from gfcr.core.policy import Policy
from gfcr.core.services import Pending, Services, WeightHandle, awake
from gfcr.core.stage import Filter, Generate, OnSegment, StageLearner, StepContext
from gfcr.core.stage import Task, TrainResult
from gfcr.core.settings import Sampled
from gfcr.evaluation.heldout import evaluate
from gfcr.core.filters import applied
from gfcr.runner.serial import SerialCalls


@dataclass(frozen=True)
class InProcessHandle:
    """A version of the policy's weights in this process: the policy's live tensors, or
    a copy of them (``frozen``)."""

    policy: Policy
    version: int
    copied: Any = None
    """The tensors frozen at hand-out (None: the policy's live ones)."""

    def state(self) -> Any:
        return self.policy.weights() if self.copied is None else self.copied

    def save(self, path: Path, dtype: str | None = None) -> None:
        if self.copied is not None:
            raise TypeError("a frozen in-process handle is only loaded in this process")
        self.policy.save_weights(path, dtype)

    def frozen(self) -> "InProcessHandle":
        if self.copied is not None:
            return self
        return replace(self, copied=copy.deepcopy(self.policy.weights()))


class LocalLearner:
    """The train stage's learner over the run's policy (gfcr.core.services.Learner); without
    a train stage it only holds the policy (warm start, checkpoints)."""

    def __init__(self, policy: Policy, learner: StageLearner | None) -> None:
        self.policy, self.learner = policy, learner

    @property
    def version(self) -> int:
        return self.policy.version

    def update(self, ctx: StepContext, batch: pa.Table) -> tuple[TrainResult, WeightHandle]:
        if self.learner is None:
            raise TypeError("the pipeline has no train stage, so nothing updates the policy")
        result = self.learner.update(ctx, batch)
        return result, self.publish()

    @property
    def adapter_only(self) -> bool:
        """Whether the weights it hands out and checkpoints are an adapter over a frozen
        base (LoRA) that the run rebuilds on resume (the warm start again: gfcr.launch.run)."""
        return isinstance(self.learner, AdapterWeights) and self.learner.trains_adapter

    def handle(self) -> WeightHandle:
        if isinstance(self.learner, AdapterWeights):
            adapter = self.learner.adapter_handle(self.policy.version)
            if adapter is not None:
                return adapter
        return InProcessHandle(self.policy, self.policy.version)

    def publish(self) -> WeightHandle:
        self.policy.version += 1
        return self.handle()

    def state_dict(self) -> dict[str, Any] | None:
        return None if self.learner is None else self.learner.state_dict()

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        if self.learner is not None and state is not None:
            if "sharded" in state:
                raise ValueError("the checkpoint holds a sharded learner's state "
                                 f"({state['sharded']}); resume it with learner.ranks >= 1")
            self.learner.load_state_dict(state)

    def save_weights(self, path: Path) -> None:
        if not (isinstance(self.learner, AdapterWeights) and self.learner.save_adapter(path)):
            self.policy.save_weights(path)

    def load_weights(self, path: Path, version: int) -> None:
        if not (isinstance(self.learner, AdapterWeights) and self.learner.load_adapter(path)):
            self.policy.load_weights(path)
        self.policy.version = version

    def encode(self, text: str) -> list[int]:
        """``text`` as the policy's token ids (gfcr.core.stage.Teacher)."""
        return list(self.policy.tokenizer.encode(text))

    def logprobs(self, prompts: list[list[int]], completions: list[list[int]],
                 temperature: float) -> list[list[float]]:
        # getattr: teacher forcing is optional on a stage's learner (GRPO's has it)
        forced = getattr(self.learner, "logprobs", None)
        if forced is None:
            raise TypeError("teacher-forced logprobs need a train stage whose learner "
                            "offers them (GRPO's does)")
        return list(forced(prompts, completions, temperature))

    def close(self) -> None:
        pass  # nothing started


class SameTensors:
    """The in-process weight sync (gfcr.core.services.WeightSync): an engine that shares the
    learner's module is only told its weights changed (vLLM then copies them into its
    own); one holding its own policy copies the handle's tensors in place."""

    def __init__(self, engine: Engine, policy: Policy, *, shared: bool) -> None:
        self.engine, self.policy, self.shared = engine, policy, shared

    def send(self, handle: WeightHandle) -> None:
        self.engine.update_weights(None if self.shared else handle.state())
        if self.policy is not None:
            self.policy.version = handle.version  # the version it holds is the handle's


class LocalScorer:
    """Filter stages run here, on this thread."""

    def score(self, ctx: StepContext, stage: Filter, rows: pa.Table) -> pa.Table:
        return applied(stage.apply(ctx, rows), stage.label)


def generate_with(engine: Engine, ctx: StepContext, gen: Generate, plan: pa.Table,
                  hooks: list[OnSegment]) -> pa.Table:
    """``gen`` on ``plan`` with ``engine``, the in-flight ``hooks`` run between its
    segments: one generate call, as every generator in this process makes it."""
    return gen.generate(ctx, plan, engine, SegmentHooks(ctx, hooks) if hooks else None)


class LocalGenerator:
    """An engine in this process (gfcr.core.services.Generator).

    ``policy`` is the engine's own policy: the learner's when ``shared`` (a load then
    only tells the engine its weights changed), else a copy that each load fills. With
    ``background`` the engine generates on one thread of its own, in submission order,
    so the caller can train meanwhile; a load behind work in flight is queued with a
    frozen copy of the tensors, so the learner may update at once."""

    def __init__(self, engine: Engine, policy: Policy, *, shared: bool = True,
                 background: bool = False,
                 capabilities: frozenset[str] = frozenset()) -> None:
        self.engine, self.policy, self.shared = engine, policy, shared
        self.sync = SameTensors(engine, policy, shared=shared)
        self._capabilities = capabilities
        self._calls = SerialCalls(background=background, name="gfcr-generate")
        self._loaded = int(engine.version)

    @property
    def version(self) -> int:
        return self._loaded

    @property
    def capabilities(self) -> frozenset[str]:
        return self._capabilities

    def submit(self, ctx: StepContext, gen: Generate, plan: pa.Table,
               hooks: list[OnSegment]) -> Pending:
        return self._calls.run(lambda: generate_with(self.engine, ctx, gen, plan, hooks))

    def load(self, handle: WeightHandle) -> None:
        if self._calls.busy():
            frozen = handle.frozen()
            self._calls.run(lambda: self._load_now(frozen))
        else:
            self._load_now(handle)

    def evaluate(self, task: Task, prompts: pa.Table, *, handle: WeightHandle,
                 max_tokens: int, progress: Callable[[int, int], None] | None,
                 sampled: Sampled | None = None, seed: int = 0) -> dict[str, Any]:
        self.drain()
        if handle.version != self.version:
            self._load_now(handle)
        return evaluate(task, self.engine, prompts, max_tokens=max_tokens,
                        progress=progress, sampled=sampled, seed=seed)

    def asleep(self) -> contextlib.AbstractContextManager[None]:
        engine = self.engine
        if not self._calls.background and isinstance(engine, EngineSleep) and engine.sleep_mode:
            return _asleep(engine)
        return awake()

    def step_metrics(self, ctx: StepContext, rollouts: pa.Table) -> dict[str, float]:
        return {}

    def drain(self) -> None:
        """Wait until nothing submitted is still running."""
        self._calls.drain()

    def close(self) -> None:
        self._calls.close()

    def get_rng_state(self) -> object:
        """The engine's sampler state, for checkpoints (None: it carries none)."""
        return self.engine.get_rng_state() if isinstance(self.engine, EngineRng) else None

    def set_rng_state(self, state: object) -> None:
        if state is not None and isinstance(self.engine, EngineRng):
            self.engine.set_rng_state(state)

    def _load_now(self, handle: WeightHandle) -> None:
        self.sync.send(handle)
        self._loaded = handle.version


@contextlib.contextmanager
def _asleep(engine: EngineSleep) -> Iterator[None]:
    """The engine asleep while the learner updates; awake again before the weight sync
    that follows (also when the update fails)."""
    engine.sleep()
    try:
        yield
    finally:
        engine.wake_up()


class SegmentHooks:
    """The control stages' on_segment hooks as the one engine hook; "prune" wins over "stop".
    Hooks get ``ctx.flight``, the whole call (:class:`gfcr.core.engine.Flight`): a generate stage
    declares each request's group with ``expect(groups)`` before generating (duck-typed)."""

    def __init__(self, ctx: StepContext, hooks: list[OnSegment]) -> None:
        self.hooks, self.base = hooks, ctx
        self.expect({})

    def expect(self, groups: dict[int, str]) -> None:
        """Start a new engine call whose request ``key -> group id`` is ``groups``."""
        self.flight = Flight(groups=dict(groups))
        self.ctx = replace(self.base, flight=self.flight)

    def wave(self, keys: list[int]) -> None:
        """The engine starts a wave of requests ``keys`` (see gfcr.core.engine.SegmentHook)."""
        self.flight.start(keys)

    def __call__(self, inflight: list[Inflight]) -> dict[int, Decision]:
        self.flight.observe(inflight)
        decisions: dict[int, Decision] = {}
        for hook in self.hooks:
            for key, decision in hook.on_segment(self.ctx, inflight).items():
                if decisions.get(key) != "prune":  # prune wins over stop
                    decisions[key] = decision
        self.flight.decided(decisions, inflight)
        return decisions


def local_services(engine: Engine, policy: Policy, learner: StageLearner | None, *,
                   capabilities: frozenset[str] = frozenset()) -> Services:
    """Today's placement: everything in this process, the engine sharing ``policy``."""
    return Services(generator=LocalGenerator(engine, policy, capabilities=capabilities),
                    learner=LocalLearner(policy, learner), scorer=LocalScorer())
