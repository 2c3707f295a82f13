"""Stage kinds, their protocols, and the one registry every operator goes through.

A stage is a small frozen pydantic model registered under a ``type`` name with
:func:`register`. Its *kind* says where it may stand in a pipeline and which protocol it
implements:

========  ===========================================================================
replay    ``select(ctx, chosen) -> prompts`` before generation and/or
          ``augment(ctx, batch) -> batch`` after filtering (curricula, recycled partials,
          reused rollouts)
control   ``allocate(ctx, plan) -> plan`` (samples and token budget per prompt) and/or
          ``on_segment(ctx, inflight) -> decisions`` between generation segments
generate  ``generate(ctx, plan, engine, on_segment) -> rollouts``
filter    ``apply(ctx, rollouts) -> FilterResult``: write score columns, and/or a keep mask
          with a reason. The loop, not the filter, marks dropped rows.
train     ``learner(policy, seed=...) -> Learner``, whose ``update(ctx, batch)`` returns
          advantages and metrics
========  ===========================================================================

Besides stages, pipelines name *components* resolved through the same registry: a ``task``
(prompt source and scorer), a ``policy`` (model and tokenizer), an ``engine`` and a
``warmstart``. Every stage declares the columns it ``reads`` and ``writes``; the pipeline
checks them when it is built.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace
from importlib.metadata import entry_points
from typing import Any, Callable, ClassVar, Literal, Protocol, TypeVar, runtime_checkable

import numpy as np
import pyarrow as pa
from pydantic import BaseModel, ConfigDict

from gfcr.engine import Decision, Engine, Flight, Inflight, SegmentHook

StageKind = Literal["replay", "control", "generate", "filter", "train"]
ComponentKind = Literal["task", "policy", "engine", "warmstart"]
Kind = Literal[StageKind, ComponentKind]

STAGE_ORDER: tuple[StageKind, ...] = ("replay", "control", "generate", "filter", "train")
"""Legal order of stage kinds in a pipeline; a kind may repeat, never go backwards."""


class Spec(BaseModel):
    """Base of every config: strict (unknown fields are errors) and immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


class StageSpec(Spec):
    """Fields every stage has. ``name`` defaults to the stage's ``type``.

    A stage may also define ``check_pipeline(stages) -> list[str]``: rules it states about
    the other stages of its pipeline (e.g. a train stage's temperature must be the
    generate stage's), checked when the pipeline is built; each problem names the stage,
    field and value.
    """

    name: str | None = None
    kind: ClassVar[StageKind]
    reads: ClassVar[frozenset[str]] = frozenset()
    writes: ClassVar[frozenset[str]] = frozenset()
    owns: ClassVar[frozenset[str]] = frozenset()
    """Decisions only one stage of a pipeline may take (e.g. "stop", "n")."""

    @property
    def label(self) -> str:
        """The stage's name in errors, task names and ``--set`` paths."""
        return self.name or getattr(self, "type")


# --------------------------------------------------------------------------- context


@dataclass
class StepContext:
    """What a stage may know about the step it runs in. Stages do no I/O through it
    except reading history."""

    run_id: str
    step: int
    seed: int
    policy_version: int
    task: "Task"
    history: Any = None
    """A store.History reader (as of this step), or None when the run has no store."""
    round: int = 0
    """Generation round inside the step: 0, then 1, 2, ... while a filter asks to refill."""
    quota: int | None = None
    """Prompts wanted in this round (None: the select stages' own batch size)."""
    flight: Flight | None = None
    """Inside on_segment hooks: the whole generate call as hooks know it (gfcr.engine.Flight);
    None elsewhere."""
    _rng: dict[str, np.random.Generator] = field(default_factory=dict, repr=False)

    def rng(self, stage: str) -> np.random.Generator:
        """A generator seeded by (run seed, step, round, stage): identical under any
        executor, and different in every refill round."""
        if stage not in self._rng:
            digest = int.from_bytes(hashlib.sha256(stage.encode()).digest()[:8], "little")
            self._rng[stage] = np.random.default_rng([self.seed, self.step, self.round,
                                                      digest])
        return self._rng[stage]

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


class Select(Protocol):
    def select(self, ctx: StepContext, chosen: pa.Table) -> pa.Table: ...


class Augment(Protocol):
    def augment(self, ctx: StepContext, batch: pa.Table) -> pa.Table: ...


class Allocate(Protocol):
    def allocate(self, ctx: StepContext, plan: pa.Table) -> pa.Table: ...


class OnSegment(Protocol):
    def on_segment(self, ctx: StepContext, inflight: list[Inflight]) -> dict[int, Decision]: ...


class Generate(Protocol):
    def generate(self, ctx: StepContext, plan: pa.Table, engine: Engine,
                 on_segment: SegmentHook | None) -> pa.Table: ...


class Filter(Protocol):
    def apply(self, ctx: StepContext, rollouts: pa.Table) -> FilterResult: ...


class Refill(Protocol):
    """Optional on a filter: after a round, how many more prompts the step should draw
    (0: the batch is full, or the filter's bound on extra rounds is reached). It sees the
    step's complete rollouts so far; ``ctx.round`` is the number of rounds already run."""

    def shortfall(self, ctx: StepContext, rollouts: pa.Table) -> int: ...


class Learner(Protocol):
    def update(self, ctx: StepContext, batch: pa.Table) -> TrainResult: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class Train(Protocol):
    def learner(self, policy: Any, *, seed: int) -> Learner: ...


_REQUIRED: dict[str, tuple[tuple[str, ...], ...]] = {
    # each entry: alternatives; a class must define every method of at least one
    "replay": (("select",), ("augment",)),
    "control": (("allocate",), ("on_segment",)),
    "generate": (("generate",),),
    "filter": (("apply",),),
    "train": (("learner",),),
    "task": (("train_prompts", "heldout_prompts", "score"),),
    "policy": (("build",),),
    "engine": (("build",),),
    "warmstart": (("run",),),
}

# --------------------------------------------------------------------------- registry

REGISTRY: dict[str, dict[str, type[Spec]]] = {kind: {} for kind in _REQUIRED}
"""kind -> type name -> config class. Populated by :func:`register`."""

S = TypeVar("S", bound=type[Spec])


def register(kind: Kind) -> Callable[[S], S]:
    """Class decorator: register a config class under its ``type`` default.

    >>> @register("filter")
    ... class Always(StageSpec):
    ...     type: Literal["always"] = "always"
    ...     def apply(self, ctx, rollouts): return FilterResult(rollouts)
    """
    def decorate(cls: S) -> S:
        name = _type_name(cls)
        missing = _missing_methods(kind, cls)
        if missing:
            raise TypeError(f"{cls.__name__} registered as {kind!r} lacks {missing}")
        if name in REGISTRY[kind] and REGISTRY[kind][name] is not cls:
            raise ValueError(f"{kind} type {name!r} is already registered "
                             f"by {REGISTRY[kind][name].__qualname__}")
        if kind in STAGE_ORDER:
            cls.kind = kind  # type: ignore[attr-defined]
        REGISTRY[kind][name] = cls
        return cls
    return decorate


def _type_name(cls: type[Spec]) -> str:
    field_info = cls.model_fields.get("type")
    if field_info is None or not isinstance(field_info.default, str):
        raise TypeError(f"{cls.__name__} needs a field `type: Literal[...] = '<name>'`")
    return field_info.default


def _missing_methods(kind: str, cls: type) -> list[str]:
    options = _REQUIRED[kind]
    gaps = [[m for m in opt if not callable(getattr(cls, m, None))] for opt in options]
    return [] if any(not g for g in gaps) else min(gaps, key=len)


def lookup(kind: Kind, name: str) -> type[Spec]:
    """The config class registered as ``name`` for ``kind``; KeyError lists the known."""
    load_plugins()
    try:
        return REGISTRY[kind][name]
    except KeyError:
        known = ", ".join(sorted(REGISTRY[kind])) or "none"
        raise KeyError(f"unknown {kind} type {name!r}; known: {known}") from None


_PLUGINS_LOADED = False


def load_plugins() -> None:
    """Import every package named in the ``gfcr.plugins`` entry-point group once.

    This is how operator libraries (``stages`` ships as one) fill the registry without
    gfcr importing them.
    """
    global _PLUGINS_LOADED
    if _PLUGINS_LOADED:
        return
    _PLUGINS_LOADED = True
    for ep in entry_points(group="gfcr.plugins"):
        ep.load()


def implements(stage: object, method: str) -> bool:
    """Whether ``stage`` provides ``method`` (the optional halves of replay/control)."""
    return callable(getattr(stage, method, None))
