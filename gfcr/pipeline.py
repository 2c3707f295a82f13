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
import runpy
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Iterable

import yaml
from pydantic import Field, ValidationError, field_validator

from gfcr.rollout import PROMPT_COLUMNS
from gfcr.stage import (REGISTRY, STAGE_ORDER, Spec, StageSpec, implements, load_plugins,
                        lookup)

COMPONENTS = ("task", "policy", "engine", "warmstart")
"""Pipeline fields resolved through the registry, by the kind of the same name."""


class PipelineError(ValueError):
    """A pipeline could not be built; ``problems`` lists each problem found."""

    def __init__(self, problems: list[str], *, where: str = "pipeline") -> None:
        self.problems = problems
        body = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"{where} is invalid ({len(problems)} problem"
                         f"{'s' if len(problems) != 1 else ''}):\n{body}")


class Evaluation(Spec):
    """Held-out greedy evaluation, run before the first step, every ``every`` steps and
    after the last."""

    size: int = Field(64, ge=1)
    """Number of held-out prompts (taken from the task's held-out split)."""
    every: int = Field(0, ge=0)
    """Evaluate every N steps as well; 0 means only before and after."""
    max_tokens: int = Field(16, ge=1)


class Checkpointing(Spec):
    """When a run saves a checkpoint (see :mod:`gfcr.checkpoint`): after every ``every``
    steps and after the last, keeping the newest ``keep``. A run resumes from the newest
    complete one; these settings may change when a run is resumed."""

    every: int = Field(10, ge=0)
    """Save after every N steps; 0 saves only after the last step."""
    keep: int = Field(2, ge=1)
    """Complete checkpoints kept per run; older ones are deleted once a newer one is whole."""


class Pipeline(Spec):
    """A GFCR pipeline: where prompts come from, which policy and engine, and the stages.

    >>> Pipeline(name="demo", task=..., policy=..., engine=..., stages=[...])  # doctest: +SKIP
    """

    name: str
    seed: int = 0
    steps: int = Field(20, ge=1)
    task: Any
    policy: Any
    engine: Any
    warmstart: Any = None
    stages: tuple[Any, ...]
    evaluation: Evaluation = Evaluation()
    checkpoint: Checkpointing = Checkpointing()

    def __init__(self, **data: Any) -> None:
        problems: list[str] = []
        data = _resolve(data, problems)
        try:
            super().__init__(**data)
        except ValidationError as err:
            problems.extend(_format_errors(err))
        if not problems:
            problems.extend(check(self))
        if problems:
            raise PipelineError(problems, where=f"pipeline {data.get('name', '?')!r}")

    @field_validator("stages", mode="before")
    @classmethod
    def _listlike(cls, value: Any) -> Any:
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
        for key in COMPONENTS:
            value = getattr(self, key)
            out[key] = None if value is None else value.model_dump(mode="json")
        out["stages"] = [s.model_dump(mode="json") for s in self.stages]
        out["evaluation"] = self.evaluation.model_dump(mode="json")
        out["checkpoint"] = self.checkpoint.model_dump(mode="json")
        return out

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    @classmethod
    def from_yaml(cls, text: str, *, where: str = "YAML") -> "Pipeline":
        data = yaml.safe_load(text)
        if not isinstance(data, dict):
            raise PipelineError([f"{where} holds {type(data).__name__}, not a mapping "
                                 "of pipeline fields"], where=where)
        return cls(**data)

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
            _apply_override(data, assignment, problems)
        if problems:
            raise PipelineError(problems, where="--set")
        return Pipeline(**data)


# --------------------------------------------------------------------------- resolution


def _resolve(data: dict[str, Any], problems: list[str]) -> dict[str, Any]:
    """Turn component and stage mappings into registered config instances."""
    data = dict(data)
    for key in COMPONENTS:
        if data.get(key) is not None:
            data[key] = _resolve_one(key, data[key], key, problems)
    stages = data.get("stages")
    if isinstance(stages, (list, tuple)):
        data["stages"] = tuple(_resolve_stage(i, s, problems) for i, s in enumerate(stages))
    return data


def _resolve_stage(index: int, value: Any, problems: list[str]) -> Any:
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
            return _resolve_one(kind, value, where, problems)
    load_plugins()
    known = sorted(t for k in STAGE_ORDER for t in REGISTRY[k])
    problems.append(f"{where}: unknown stage type {value.get('type')!r}; "
                    f"known: {', '.join(known) or 'none'}")
    return value


def _resolve_one(kind: str, value: Any, where: str, problems: list[str]) -> Any:
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
        problems.extend(f"{where}: {p}" for p in _format_errors(err))
        return value


def _format_errors(err: ValidationError) -> list[str]:
    out = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"])
        field = f"field {loc!r}: " if loc else ""
        got = f" (got {e['input']!r})" if e["type"] != "missing" else ""
        out.append(f"{field}{e['msg']}{got}")
    return out


# --------------------------------------------------------------------------- checks


def check(p: Pipeline) -> list[str]:
    """Every structural problem of a resolved pipeline, each naming the stage."""
    problems: list[str] = []
    _check_components(p, problems)
    stages = [s for s in p.stages if isinstance(s, StageSpec)]
    if len(stages) != len(p.stages):
        problems.append("stages: every entry must be a registered stage")
        return problems
    _check_order(stages, problems)
    _check_names(stages, problems)
    _check_columns(stages, problems)
    _check_owners(stages, problems)
    _check_stage_rules(stages, problems)
    return problems


def _check_components(p: Pipeline, problems: list[str]) -> None:
    for key in COMPONENTS:
        value = getattr(p, key)
        if value is None and key != "warmstart":
            problems.append(f"{key}: required")
        elif value is not None and type(value) not in REGISTRY[key].values():
            problems.append(f"{key}: {type(value).__name__} is not a registered {key}")


def _check_order(stages: list[StageSpec], problems: list[str]) -> None:
    generators = [s.label for s in stages if s.kind == "generate"]
    if len(generators) != 1:
        problems.append(f"stages: exactly one generate stage is needed, found "
                        f"{len(generators)} ({', '.join(generators) or 'none'})")
    trainers = [s.label for s in stages if s.kind == "train"]
    if len(trainers) > 1:
        problems.append(f"stages: at most one train stage, found {', '.join(trainers)}")
    for before, after in zip(stages, stages[1:]):
        if STAGE_ORDER.index(after.kind) < STAGE_ORDER.index(before.kind):
            problems.append(f"stage {after.label!r} ({after.kind}) comes after "
                            f"{before.label!r} ({before.kind}); kinds must follow the order "
                            f"{' -> '.join(STAGE_ORDER)}")


def _check_names(stages: list[StageSpec], problems: list[str]) -> None:
    seen: set[str] = set()
    reserved = set(Pipeline.model_fields)
    for s in stages:
        if s.label in seen:
            problems.append(f"stage name {s.label!r} is used twice; give one a `name`")
        if s.label in reserved:
            problems.append(f"stage name {s.label!r} clashes with the pipeline field of "
                            "that name; give it another `name`")
        seen.add(s.label)


def execution_order(stages: Iterable[StageSpec]) -> list[tuple[str, StageSpec]]:
    """(phase, stage) in the order the loop runs them: select, allocate, generate,
    filter, augment, train (on_segment hooks run inside generate)."""
    stages = list(stages)
    phases = [("select", "replay"), ("allocate", "control"), ("generate", "generate"),
              ("apply", "filter"), ("augment", "replay"), ("learner", "train")]
    return [(method, s) for method, kind in phases for s in stages
            if s.kind == kind and implements(s, method)]


def _check_columns(stages: list[StageSpec], problems: list[str]) -> None:
    available = set(PROMPT_COLUMNS) | {"n", "max_tokens"}
    checked: set[int] = set()
    for _, s in execution_order(stages):
        if id(s) not in checked:
            for column in sorted(set(s.reads) - available):
                problems.append(f"stage {s.label!r} reads column {column!r}, which no "
                                "upstream stage writes")
            checked.add(id(s))
        available |= set(s.writes)


def _check_stage_rules(stages: list[StageSpec], problems: list[str]) -> None:
    """What each stage's optional ``check_pipeline(stages)`` reports about the others."""
    for s in stages:
        rule = getattr(s, "check_pipeline", None)
        if callable(rule):
            problems.extend(rule(tuple(stages)))


DECISIONS = {
    "stop": "which in-flight rollouts end early and are kept as partial rollouts",
    "prune": "which in-flight rollouts are discarded",
    "n": "how many samples each prompt gets",
    "max_tokens": "each prompt's token cap",
}
"""What the exclusive decisions (``StageSpec.owns``) of the shipped stages decide."""


def _check_owners(stages: list[StageSpec], problems: list[str]) -> None:
    owners: dict[str, str] = {}
    for s in stages:
        for decision in sorted(s.owns):
            if decision in owners:
                what = f" ({DECISIONS[decision]})" if decision in DECISIONS else ""
                problems.append(f"stages {owners[decision]!r} and {s.label!r} both own the "
                                f"{decision!r} decision{what}: only one stage may take it, "
                                "or each rule would undo the other's; keep one of them")
            owners.setdefault(decision, s.label)


# --------------------------------------------------------------------------- overrides


def _apply_override(data: dict[str, Any], assignment: str, problems: list[str]) -> None:
    path, sep, raw = assignment.partition("=")
    if not sep or not path:
        problems.append(f"{assignment!r}: expected PATH=VALUE, e.g. grpo.lr=1e-3")
        return
    value = yaml.safe_load(raw) if raw else ""
    head, _, field = path.partition(".")
    if not field:
        if head not in Pipeline.model_fields or head in COMPONENTS or head == "stages":
            problems.append(f"{path!r}: not a settable pipeline field "
                            f"(use a component or stage name followed by .field)")
        else:
            data[head] = value
        return
    target = _override_target(data, head)
    if target is None:
        names = [s.get("name") or s.get("type") for s in data["stages"]]
        problems.append(f"{path!r}: no component or stage named {head!r}; stages: "
                        f"{', '.join(names)}; components: {', '.join(COMPONENTS)}, evaluation, "
                        "checkpoint")
        return
    _set_nested(target, field.split("."), value)


def _override_target(data: dict[str, Any], head: str) -> dict[str, Any] | None:
    if head in (*COMPONENTS, "evaluation", "checkpoint"):
        return data[head]
    for s in data["stages"]:
        if (s.get("name") or s.get("type")) == head:
            return s
    return None


def _set_nested(target: dict[str, Any], keys: list[str], value: Any) -> None:
    for key in keys[:-1]:
        target = target.setdefault(key, {})
    target[keys[-1]] = value


# --------------------------------------------------------------------------- loading


def load(ref: str) -> Pipeline:
    """A pipeline from a registered name (``gfcr.pipelines`` entry points), a ``.py``
    file that defines ``pipeline``, or a ``.yaml`` file."""
    path = Path(ref)
    if path.suffix in (".yaml", ".yml"):
        if not path.is_file():
            raise PipelineError([f"no such file: {ref}"], where=ref)
        return Pipeline.from_yaml(path.read_text(), where=ref)
    if path.suffix == ".py":
        if not path.is_file():
            raise PipelineError([f"no such file: {ref}"], where=ref)
        return _from_module(runpy.run_path(str(path)), ref)
    named = {ep.name: ep for ep in entry_points(group="gfcr.pipelines")}
    if ref not in named:
        raise PipelineError([f"{ref!r} is neither a .py/.yaml file nor a known pipeline; "
                             f"known: {', '.join(sorted(named)) or 'none'}"], where=ref)
    obj = named[ref].load()
    return _from_module({"pipeline": obj}, ref)


def _from_module(namespace: dict[str, Any], where: str) -> Pipeline:
    obj = namespace.get("pipeline")
    if callable(obj) and not isinstance(obj, Pipeline):
        obj = obj()
    if not isinstance(obj, Pipeline):
        found = type(obj).__name__ if obj is not None else "nothing"
        raise PipelineError([f"{where} must define `pipeline = Pipeline(...)` (or a "
                             f"function `pipeline()` returning one); found {found}"],
                            where=where)
    return obj

