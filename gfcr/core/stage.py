"""Stage kinds, their protocols, and the phase table the registry checks them against.

A stage is a small frozen pydantic model registered under a ``type`` name with
:func:`gfcr.core.registry.register`. Its *kind* says where it may stand in a pipeline and
which phases it may implement. The phase table :data:`PHASES` is the one description of that: registration
checks it, the pipeline validates against it, the loop runs the phases in its order (each
stage narrowed to its phase's protocol) and the table below is rendered from it:

{phases}

Besides stages, pipelines name *components* resolved through the same registry: a ``task``
(prompt source and scorer), a ``policy`` (model and tokenizer), an ``engine`` and a
``warmstart``. Every stage declares the columns it ``reads`` and ``writes``; the pipeline
checks them when it is built.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace
from typing import (Any, ClassVar, Generic, Iterable, Literal, Protocol, TypeVar,
                    runtime_checkable)

import numpy as np
import pyarrow as pa
from pydantic import field_validator

from gfcr.core import names, storage
from gfcr.core.engine import Decision, Engine, Flight, Inflight, SegmentHook
from gfcr.core.policy import Policy
from gfcr.core.spec import Spec
from gfcr.core.storage import History, HistorySource

StageKind = Literal["replay", "control", "generate", "filter", "train"]
ComponentKind = Literal["task", "policy", "engine", "warmstart"]
Kind = Literal[StageKind, ComponentKind]

STAGE_ORDER: tuple[StageKind, ...] = ("replay", "control", "generate", "filter", "train")
"""Legal order of stage kinds in a pipeline; a kind may repeat, never go backwards."""


class StageSpec(Spec):
    """Fields every stage has. ``name`` defaults to the stage's ``type``. Optional
    protocols a stage may implement (rules about its pipeline, ...) are in
    gfcr.core.capabilities."""

    name: str | None = None
    """The stage's label (default: its type); it names staged files, so gfcr.core.names rules."""
    kind: ClassVar[StageKind]

    # The column and decision contract is instance-level: a stage overrides these with a
    # ClassVar when it is fixed, or a property when its config decides it.
    @property
    def reads(self) -> frozenset[str]:
        """Columns the stage reads, which an upstream stage (or the prompt) must write."""
        return frozenset()

    @property
    def writes(self) -> frozenset[str]:
        """Columns the stage adds for downstream stages."""
        return frozenset()

    @property
    def owns(self) -> frozenset[str]:
        """Decisions only one stage of a pipeline may take (e.g. "stop", "n")."""
        return frozenset()
    engine_needs: ClassVar[frozenset[str]] = frozenset()
    """Engine capabilities this stage needs (gfcr.core.capabilities), checked at build time."""

    @field_validator("name")
    @classmethod
    def _safe_name(cls, value: str | None) -> str | None:
        if value is not None and names.problem("name", value) is not None:
            raise ValueError(names.rule())
        return value

    @property
    def label(self) -> str:
        """The stage's name in errors, task names and ``--set`` paths."""
        return self.name or str(self.model_dump(include={"type"})["type"])


# --------------------------------------------------------------------------- context


@runtime_checkable
class Teacher(Protocol):
    """Teacher forcing at the learner's weights (gfcr.core.services.Learner.logprobs) for stages
    that score with the policy (IGPO): ``encode`` with its tokenizer, ``logprobs``."""

    def encode(self, text: str) -> list[int]: ...

    def logprobs(self, prompts: list[list[int]], completions: list[list[int]],
                 temperature: float) -> list[list[float]]: ...


@dataclass
class StepContext:
    """What a stage may know about the step it runs in, and its only door to stored
    rows: ``history`` and ``other_store`` (typed reads, gfcr.core.storage.History)."""

    run_id: str
    step: int
    seed: int
    policy_version: int
    task: "Task"
    history: History | None = None
    """The run's store as of this step's snapshot, or None when the run has no store."""
    stores: HistorySource | None = None
    """Opens other stores (see :meth:`other_store`); None: the installed store backend."""
    round: int = 0
    """Generation round inside the step: 0, then 1, 2, ... while a filter asks to refill."""
    quota: int | None = None
    """Prompts wanted in this round (None: the select stages' own batch size)."""
    flight: Flight | None = None
    """Inside on_segment hooks: the whole generate call as hooks know it (gfcr.core.engine.Flight);
    None elsewhere."""
    teacher: Teacher | None = None
    """The learner's teacher forcing where the stage runs beside it (the loop's process);
    None elsewhere (an engine worker, a test context)."""
    _rng: dict[str, np.random.Generator] = field(default_factory=dict, repr=False)

    def rng(self, stage: str) -> np.random.Generator:
        """A generator seeded by (run seed, step, round, stage): identical under any
        executor, and different in every refill round."""
        if stage not in self._rng:
            digest = int.from_bytes(hashlib.sha256(stage.encode()).digest()[:8], "little")
            self._rng[stage] = np.random.default_rng([self.seed, self.step, self.round,
                                                      digest])
        return self._rng[stage]

    def other_store(self, uri: str, *, as_of_snapshot: int | None = None) -> History:
        """Another store's history, read-only, as of ``as_of_snapshot`` (None: live)."""
        return (self.stores or storage.other_store)(uri, as_of_snapshot=as_of_snapshot)

    def for_round(self, round: int, quota: int) -> "StepContext":
        """The context of a refill round of this step."""
        return replace(self, round=round, quota=quota, _rng={})


@runtime_checkable
class Task(Protocol):
    """A task component: training and held-out prompts (PROMPT_SCHEMA tables), and a
    scorer for completions."""

    def train_prompts(self) -> pa.Table: ...

    def heldout_prompts(self) -> pa.Table: ...

    def score(self, completion: str, answer: str | None, meta: str | None) -> float:
        """Reward of one completion; may raise (the loop records the error)."""
        ...


# --------------------------------------------------------------------------- stages


@dataclass(frozen=True)
class FilterResult:
    """What a filter returns: the table (with any columns it wrote) and an optional keep
    mask. ``reason`` is one string for all dropped rows or one per row."""

    table: pa.Table
    keep: pa.Array | list[bool] | None = None
    reason: str | list[str | None] | None = None


@dataclass(frozen=True)
class TrainResult:
    """A learner's update: one advantage per batch row, and scalar metrics."""

    advantages: list[float]
    metrics: dict[str, float]


@runtime_checkable
class Stage(Protocol):
    """What every stage is, whatever its phases: named, of a kind, with a column contract."""

    kind: ClassVar[StageKind]

    @property
    def label(self) -> str: ...

    @property
    def reads(self) -> frozenset[str]: ...

    @property
    def writes(self) -> frozenset[str]: ...

    @property
    def owns(self) -> frozenset[str]: ...


@runtime_checkable
class Select(Stage, Protocol):
    def select(self, ctx: StepContext, chosen: pa.Table) -> pa.Table: ...


@runtime_checkable
class Augment(Stage, Protocol):
    def augment(self, ctx: StepContext, batch: pa.Table) -> pa.Table: ...


@runtime_checkable
class Allocate(Stage, Protocol):
    def allocate(self, ctx: StepContext, plan: pa.Table) -> pa.Table: ...


@runtime_checkable
class OnSegment(Stage, Protocol):
    def on_segment(self, ctx: StepContext, inflight: list[Inflight]) -> dict[int, Decision]: ...


@runtime_checkable
class Generate(Stage, Protocol):
    def generate(self, ctx: StepContext, plan: pa.Table, engine: Engine,
                 on_segment: SegmentHook | None) -> pa.Table: ...


@runtime_checkable
class Filter(Stage, Protocol):
    def apply(self, ctx: StepContext, rollouts: pa.Table) -> FilterResult: ...


@runtime_checkable
class Refill(Stage, Protocol):
    """Optional on a filter: after a round, how many more prompts the step should draw
    (0: the batch is full, or the filter's bound on extra rounds is reached). It sees the
    step's complete rollouts so far; ``ctx.round`` is the number of rounds already run."""

    def shortfall(self, ctx: StepContext, rollouts: pa.Table) -> int: ...


@runtime_checkable
class StageLearner(Protocol):
    def update(self, ctx: StepContext, batch: pa.Table) -> TrainResult: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@runtime_checkable
class Train(Stage, Protocol):
    def learner(self, policy: Policy, *, seed: int) -> StageLearner: ...


P = TypeVar("P", bound=Stage)


@dataclass(frozen=True)
class Phase(Generic[P]):
    """One row of the phase table: the method a stage of ``kind`` implements, typed by
    ``protocol``. A stage must implement every phase of its kind that is not
    ``optional``, and at least one phase of its kind."""

    method: str
    kind: StageKind
    protocol: type[P]
    optional: bool
    what: str

    def of(self, stages: Iterable[object]) -> list[P]:
        """The stages of ``stages`` that run in this phase, narrowed to its protocol."""
        return [s for s in stages if isinstance(s, self.protocol) and s.kind == self.kind]


SELECT = Phase("select", "replay", Select, True,
               "``select(ctx, chosen) -> prompts``: extend the step's prompt choice")
ALLOCATE = Phase("allocate", "control", Allocate, True,
                 "``allocate(ctx, plan) -> plan``: samples ``n`` and ``max_tokens`` per prompt")
ON_SEGMENT = Phase("on_segment", "control", OnSegment, True,
                   "``on_segment(ctx, inflight) -> decisions``: stop or prune between "
                   "generation segments (runs inside generate)")
GENERATE = Phase("generate", "generate", Generate, False,
                 "``generate(ctx, plan, engine, on_segment) -> rollouts``")
FILTER = Phase("apply", "filter", Filter, False,
               "``apply(ctx, rollouts) -> FilterResult``: score columns and/or a keep mask "
               "with a reason (the loop marks the dropped rows)")
REFILL = Phase("shortfall", "filter", Refill, True,
               "``shortfall(ctx, rollouts) -> int``: more prompts for another round")
AUGMENT = Phase("augment", "replay", Augment, True,
                "``augment(ctx, batch) -> batch``: mix reused rollouts into the batch")
TRAIN = Phase("learner", "train", Train, False,
              "``learner(policy, seed=...) -> StageLearner``, whose ``update(ctx, batch)`` "
              "returns advantages and metrics")

PHASES: tuple[Phase[Any], ...] = (SELECT, ALLOCATE, ON_SEGMENT, GENERATE, FILTER, REFILL,
                                  AUGMENT, TRAIN)
"""The phases in the order a step runs them (on_segment inside generate, shortfall after
each round's filters)."""


def phase_table() -> str:
    """The phase table as reStructuredText (the module docstring and CONTRIBUTING.md)."""
    rows = [(p.kind, f"{p.method}{' (optional)' if p.optional else ''}", p.what)
            for p in PHASES]
    widths = [max(len(r[i]) for r in rows + [("kind", "phase", "what")]) for i in range(3)]
    rule = "  ".join("=" * w for w in widths)
    header = "  ".join(h.ljust(w) for h, w in zip(("kind", "phase", "what"), widths))
    lines = [rule, header.rstrip(),
             rule, *("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows),
             rule]
    return "\n".join(lines)


__doc__ = (__doc__ or "").format(phases=phase_table())
