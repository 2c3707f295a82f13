"""The services a run's loop talks to: a generator, a learner and a scorer.

The loop (gfcr.runner.loop) knows the stages and the order of a step; where and how the work
runs is a service's business. Each service is a protocol with an in-process
implementation, today's code (gfcr.runner.inprocess), and others behind it (a fleet of
servers: gfcr.transport.fleet; score pools: gfcr.transport.remote). A run holds one :class:`Services` value, whatever the placement.

Weights move one way only, as :class:`WeightHandle` values: the learner owns the policy
and hands out a handle after each update; a generator ``load``\\ s a handle, through a
weight sync that fits where it runs:

- in-process, the handle is the learner's own tensors (an engine that shares the policy
  module has nothing to copy; one with its own copy copies them in place);
- across hosts, the handle is written as a versioned folder (gfcr.weights.versions: a manifest
  written last, pruned by what is still needed) that a fleet's servers read;
- a collective (NCCL broadcast from the learner's ranks to the engines') fits the same
  protocol: ``send`` broadcasts and returns a handle naming the version.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Generic, Iterator, Protocol, TypeVar, runtime_checkable

import pyarrow as pa

from gfcr.core.settings import Sampled
from gfcr.core.stage import Filter, Generate, OnSegment, StepContext, Task, TrainResult

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


@runtime_checkable
class WeightHandle(Protocol):
    """One version of the learner's weights, as the learner hands it out."""

    @property
    def version(self) -> int:
        """The policy version: the count of updates (and warm starts) behind these weights."""
        ...

    def state(self) -> object:
        """The weights as tensors in this process (a state dict); the live ones while
        the learner does not update again (see :meth:`frozen`)."""
        ...

    def save(self, path: Path, dtype: str | None = None) -> None:
        """Write the weights to ``path`` with the policy's tensor I/O, cast to ``dtype``
        (None: as the learner holds them): a file sync."""
        ...

    def frozen(self) -> "WeightHandle":
        """A handle whose tensors later updates do not change (a copy when needed): what
        a generator that loads later, behind work in flight, is given."""
        ...


class WeightSync(Protocol):
    """How a learner's handle reaches a generator's engine: the same tensors in-process
    (gfcr.runner.inprocess.SameTensors), a versioned folder across hosts
    (gfcr.weights.versions.FileSync), a broadcast on a GPU collective. ``send`` returns once the
    generator side can load ``handle.version`` and the learner may update again."""

    def send(self, handle: WeightHandle) -> None: ...


class Pending(Protocol[T_co]):
    """Work under way: ``result()`` waits for it and raises what it raised."""

    def result(self) -> T_co: ...


@dataclass
class Done(Generic[T]):
    """A :class:`Pending` that is already finished."""

    value: T

    def result(self) -> T:
        return self.value


@runtime_checkable
class Generator(Protocol):
    """Generates a plan's rollouts with the weights it has loaded.

    A plan row may continue a rollout (its ``prefix_ids``: partial rollouts, branches,
    hints), so generating and continuing are one call. ``submit`` returns at once where
    the generator can work behind the caller (a background thread, a pool of engine
    workers); calls run in the order submitted, each with the weights loaded before it.
    """

    @property
    def version(self) -> int:
        """The version of the weights loaded for the calls submitted next."""
        ...

    @property
    def capabilities(self) -> frozenset[str]:
        """What its engine can do (gfcr.core.capabilities.CAPABILITIES)."""
        ...

    def submit(self, ctx: StepContext, gen: Generate, plan: pa.Table,
               hooks: list[OnSegment]) -> Pending[pa.Table]:
        """Start ``gen`` on ``plan`` with the in-flight ``hooks``; the pending raw rollouts."""
        ...

    def load(self, handle: WeightHandle) -> None:
        """Calls submitted after this one generate with ``handle``'s weights; calls
        submitted before keep theirs. Returns once the learner may update again."""
        ...

    def evaluate(self, task: Task, prompts: pa.Table, *, handle: WeightHandle,
                 max_tokens: int, progress: Callable[[int, int], None] | None,
                 sampled: Sampled | None = None, seed: int = 0) -> dict[str, Any]:
        """Greedy accuracy with ``handle``'s weights and, with ``sampled``, mean reward
        and pass@k sampled under ``seed`` (gfcr.evaluation.heldout)."""
        ...

    def asleep(self) -> contextlib.AbstractContextManager[None]:
        """Free the accelerator while the learner updates, where the engine can and
        nothing generates meanwhile (gfcr.core.capabilities.EngineSleep)."""
        ...

    def step_metrics(self, ctx: StepContext, rollouts: pa.Table) -> dict[str, float]:
        """Metrics of the step's generate calls (remote times; none in-process)."""
        ...

    def close(self) -> None:
        """Stop background work; what was submitted and not collected is dropped."""
        ...


@runtime_checkable
class Learner(Protocol):
    """Owns the policy's weights and turns batches into updates."""

    @property
    def version(self) -> int: ...

    def update(self, ctx: StepContext, batch: pa.Table) -> tuple[TrainResult, WeightHandle]:
        """One update on ``batch``: its advantages and metrics, and the new weights."""
        ...

    def handle(self) -> WeightHandle:
        """The current weights."""
        ...

    def publish(self) -> WeightHandle:
        """The current weights as the next version, after training outside ``update``
        (a warm start changed them)."""
        ...

    def state_dict(self) -> dict[str, Any] | None:
        """What the next update depends on besides the weights (None: no train stage)."""
        ...

    def load_state_dict(self, state: dict[str, Any] | None) -> None: ...

    def save_weights(self, path: Path) -> None: ...

    def load_weights(self, path: Path, version: int) -> None: ...

    def logprobs(self, prompts: list[list[int]], completions: list[list[int]],
                 temperature: float) -> list[list[float]]:
        """Teacher-forced ``log_softmax(logits / T)`` of each completion token under the
        current weights (the ``teacher_forcing`` capability)."""
        ...

    def close(self) -> None:
        """Stop what it started (a sharded learner's processes); nothing in-process."""
        ...


@runtime_checkable
class AdapterLearner(Protocol):
    """Optional on a learner: its weights are an adapter over a frozen base (LoRA), so its
    checkpoints hold the adapter alone and a resumed run rebuilds the base first."""

    @property
    def adapter_only(self) -> bool: ...


@runtime_checkable
class Scorer(Protocol):
    """Runs a filter stage over complete rollouts: its result with drops marked
    (gfcr.core.filters.applied). Scoring environments plug in here."""

    def score(self, ctx: StepContext, stage: Filter, rows: pa.Table) -> pa.Table: ...


@dataclass
class Services:
    """Where a run's work runs: one value for every placement (in-process, workers)."""

    generator: Generator
    learner: Learner
    scorer: Scorer

    def close(self) -> None:
        try:
            self.generator.close()
        finally:
            self.learner.close()


@contextlib.contextmanager
def awake() -> Iterator[None]:
    """The context of a generator that never sleeps."""
    yield
