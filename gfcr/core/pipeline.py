"""The Pipeline: a validated composition of components and stages.

A pipeline is written in Python (``Pipeline(task=..., stages=[...])``) or YAML (the same
fields, each component and stage a mapping with its ``type``), and both round-trip. It is
checked when it is built and every problem is reported at once, each naming the stage and
field: unknown types or fields, wrong values, stage kinds out of order, a column read that
no upstream stage writes, two stages owning one decision, duplicate stage names.

The spec hash is stable: the same pipeline gives the same hash in any process.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Callable, ClassVar, Iterable, Mapping, Protocol

import yaml
from pydantic import BaseModel, ConfigDict, Field, SkipValidation, ValidationError, field_validator

from gfcr.config import problems as collect

from gfcr.core import names
from gfcr.config import overrides, yamlfile
from gfcr.core.capabilities import check_engine
from gfcr.core.composition import check_stages
from gfcr.core.engine import Engine
from gfcr.core.policy import Policy
from gfcr.core.settings import (Checkpointing, Evaluation,  # noqa: F401 (imported from here)
                                LearnerPlacement, RewardRange)
from gfcr.core.sizes import check_sizes
from gfcr.core.stage import STAGE_ORDER, Spec, StageSpec, Task
from gfcr.core.registry import REGISTRY, load_plugins, lookup

COMPONENTS = ("task", "policy", "engine", "warmstart")
"""Pipeline fields resolved through the registry, by the kind of the same name."""


class PolicyComponent(Protocol):
    """A policy config: builds the trainable policy (its weights drawn under ``seed``)."""

    def build(self, *, seed: int) -> Policy: ...


class EngineComponent(Protocol):
    """An engine config: builds the inference engine over a policy (capabilities and
    other optional protocols: gfcr.core.capabilities)."""

    def build(self, policy: Policy, *, seed: int) -> Engine: ...


class WarmstartComponent(Protocol):
    """A warm start config: trains the policy in place before the first step (e.g. SFT);
    returns its figures."""

    def run(self, policy: Policy, task: Task, *, seed: int, cache_dir: Path,
            progress: Callable[[int, int], None] | None = None) -> Mapping[str, float]: ...


class PipelineError(ValueError):
    """A pipeline could not be built; ``problems`` lists each problem found."""

    def __init__(self, problems: list[str], *, where: str = "pipeline") -> None:
        self.problems = problems
        body = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"{where} is invalid ({len(problems)} problem"
                         f"{'s' if len(problems) != 1 else ''}):\n{body}")


class Pipeline(Spec):
    """A GFCR pipeline: where prompts come from, which policy and engine, and the stages.

    >>> Pipeline(name="demo", task=..., policy=..., engine=..., stages=[...])  # doctest: +SKIP
    """

    name: str
    """Names the run (run ids start with it) and its MLflow experiment; see gfcr.core.names."""
    seed: int = Field(0, ge=0, lt=2**32)
    """Seeds every random generator of the run (numpy and torch take 0 <= seed < 2**32)."""
    steps: int = Field(20, ge=1)
    # the components and stages are registered configs, resolved by _resolve (which
    # reports every problem at once), so pydantic does not validate them again
    task: SkipValidation[Task]
    policy: SkipValidation[PolicyComponent]
    engine: SkipValidation[EngineComponent]
    warmstart: SkipValidation[WarmstartComponent | None] = None
    stages: tuple[SkipValidation[StageSpec], ...]
    evaluation: Evaluation = Evaluation()
    checkpoint: Checkpointing = Checkpointing()
    max_staleness: int = Field(0, ge=0)
    """The round-0 batches of the next ``max_staleness`` steps are generated while a step
    trains (in this process or on a fleet), with weights up to that many
    versions old and plans drawn that many steps early (gfcr.runner.rounds); 0 is synchronous.
    Stored in the spec only when set, so older specs keep their hash."""
    reward_range: RewardRange = RewardRange()
    """The range of a step's rewards; outside it they are clipped or dropped, with a
    warning (gfcr.runner.rewards). Stored in the spec only when set, as ``max_staleness``."""
    learner: LearnerPlacement = LearnerPlacement()
    """Where the train stage's learner runs: in this process, or sharded over ranks
    (gfcr.transport.sharded). Stored in the spec only when set, as ``max_staleness``."""
    nested_numbers: ClassVar[bool] = False  # the task and stages check their own
    model_config = ConfigDict(arbitrary_types_allowed=True)  # the component protocols

    def __init__(self, **data: object) -> None:
        collection = collect.active()
        earlier = collection.take() if collection else []  # a .py file's invalid configs
        problems: list[str] = []
        data = _resolve(data, problems)
        try:
            BaseModel.__init__(self, **data)
        except ValidationError as err:
            problems.extend(_format_errors(err))
        if not problems:
            problems.extend(_checked(self, quiet=bool(earlier)))
        if earlier or problems:
            raise PipelineError(earlier + problems, where=f"pipeline {data.get('name', '?')!r}")

    @field_validator("name")
    @classmethod
    def _safe_name(cls, value: str) -> str:
        if names.problem("name", value) is not None:
            raise ValueError(names.rule())
        return value

    @field_validator("stages", mode="before")
    @classmethod
    def _listlike(cls, value: object) -> object:
        return tuple(value) if isinstance(value, list) else value

    # ------------------------------------------------------------------ views

    def stage(self, label: str) -> StageSpec:
        """The stage called ``label``."""
        for s in self.stages:
            if s.label == label:
                return s
        raise KeyError(f"pipeline {self.name!r} has no stage {label!r}")

    def of_kind(self, kind: str) -> list[StageSpec]:
        return [s for s in self.stages if s.kind == kind]

    # ------------------------------------------------------------------ serialisation

    def to_dict(self) -> dict[str, Any]:
        """Plain data (every default filled in); ``Pipeline(**d)`` rebuilds it."""
        out: dict[str, Any] = {"name": self.name, "seed": self.seed, "steps": self.steps}
        for key, value in _components(self).items():
            out[key] = _dump(value)
        out["stages"] = [s.model_dump(mode="json") for s in self.stages]
        out["evaluation"] = self.evaluation.spec()
        out["checkpoint"] = self.checkpoint.model_dump(mode="json")
        if self.max_staleness:
            out["max_staleness"] = self.max_staleness
        if self.reward_range != RewardRange():
            out["reward_range"] = self.reward_range.model_dump(mode="json")
        if self.learner != LearnerPlacement():
            out["learner"] = self.learner.model_dump(mode="json")
        return out

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    @classmethod
    def from_yaml(cls, text: str, *, where: str = "YAML") -> "Pipeline":
        """The pipeline of a YAML text (read by gfcr.config.yamlfile: bounded, duplicate keys
        refused); its problems name ``where`` and the line."""
        try:
            data, lines = yamlfile.load_with_lines(text, where=where)
        except yamlfile.YamlRefused as err:
            raise PipelineError([str(err)], where=where) from None
        if not isinstance(data, dict) or not all(isinstance(k, str) for k in data):
            raise PipelineError([f"{where} holds {type(data).__name__}, not a mapping "
                                 "of pipeline fields"], where=where)
        with yamlfile.lines(where, lines):
            try:
                return cls(**data)
            except PipelineError as err:  # named by the file, not only the pipeline
                raise PipelineError(err.problems, where=f"{where} (pipeline "
                                    f"{data.get('name', '?')!r})") from None

    def spec_hash(self) -> str:
        """sha256 of the canonical JSON of the spec, first 16 hex digits."""
        canonical = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]

    def with_overrides(self, assignments: Iterable[str]) -> "Pipeline":
        """A new pipeline with ``path=value`` assignments applied; the path is
        ``field``, ``component.field`` or ``stage_name.field``; values are YAML."""
        data = self.to_dict()
        problems: list[str] = []
        for assignment in assignments:
            overrides.apply(data, assignment, problems, components=COMPONENTS,
                            fields=frozenset(Pipeline.model_fields))
        if problems:
            raise PipelineError(problems, where="--set")
        return Pipeline(**data)


# --------------------------------------------------------------------------- resolution


def _dump(value: object) -> object:
    """A component as plain data (None stays None)."""
    return value.model_dump(mode="json") if isinstance(value, BaseModel) else value


def _resolve(data: dict[str, object], problems: list[str]) -> dict[str, object]:
    """Turn component and stage mappings into registered config instances."""
    data = dict(data)
    for key in COMPONENTS:
        if data.get(key) is not None:
            data[key] = _resolve_one(key, data[key], key, problems, (key,))
    stages = data.get("stages")
    if isinstance(stages, (list, tuple)):
        data["stages"] = tuple(_resolve_stage(i, s, problems) for i, s in enumerate(stages))
    return data


def _resolve_stage(index: int, value: object, problems: list[str]) -> object:
    if isinstance(value, StageSpec):
        return value
    if not isinstance(value, dict):
        problems.append(f"stages[{index}]: expected a stage or a mapping with a 'type', "
                        f"got {value!r}")
        return value
    label = value.get("name") or value.get("type")
    where = f"stages[{index}] {label!r}"
    for kind in STAGE_ORDER:
        if value.get("type") in REGISTRY[kind]:
            return _resolve_one(kind, value, where, problems, ("stages", index))
    load_plugins()
    known = sorted(t for k in STAGE_ORDER for t in REGISTRY[k])
    at = yamlfile.where(("stages", index, "type"))
    where += f" at {at}" if at else ""
    problems.append(f"{where}: unknown stage type {value.get('type')!r}; "
                    f"known: {', '.join(known) or 'none'}")
    return value


def _resolve_one(kind: str, value: object, where: str, problems: list[str],
                 path: tuple[str | int, ...]) -> object:
    if isinstance(value, Spec):
        return value
    if not isinstance(value, dict) or "type" not in value:
        problems.append(f"{where}: expected a mapping with a 'type', got {value!r}")
        return value
    try:
        cls = lookup(kind, value["type"])  # type: ignore[arg-type]
    except KeyError as err:
        problems.append(f"{where}: {err.args[0]}")
        return value
    try:
        return cls.model_validate(value)
    except ValidationError as err:
        problems.extend(f"{where}: {p}" for p in _format_errors(err, path))
        return value


_format_errors = collect.format_errors


def _checked(p: "Pipeline", *, quiet: bool) -> list[str]:
    """check(p); with placeholders of invalid configs among its parts (``quiet``), a
    check that trips over one is skipped: their own problems are already reported."""
    try:
        return check(p)
    except Exception:
        if quiet:
            return []
        raise


# --------------------------------------------------------------------------- checks


def check(p: Pipeline) -> list[str]:
    """Every structural problem of a resolved pipeline, each naming the stage."""
    problems: list[str] = []
    _check_components(p, problems)
    stages = [s for s in p.stages if isinstance(s, StageSpec)]
    if len(stages) != len(p.stages):
        problems.append("stages: every entry must be a registered stage")
        return problems
    check_stages(stages, problems, reserved=set(Pipeline.model_fields))
    check_engine(p.engine, stages, problems)
    check_sizes(p.task, p.evaluation, stages, problems)
    return problems


def _components(p: Pipeline) -> dict[str, object]:
    """The pipeline's components by field name (the order of COMPONENTS)."""
    return {"task": p.task, "policy": p.policy, "engine": p.engine, "warmstart": p.warmstart}


def _check_components(p: Pipeline, problems: list[str]) -> None:
    for key, value in _components(p).items():
        if value is None and key != "warmstart":
            problems.append(f"{key}: required")
        elif value is not None and type(value) not in REGISTRY[key].values():
            problems.append(f"{key}: {type(value).__name__} is not a registered {key}")
