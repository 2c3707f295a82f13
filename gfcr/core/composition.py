"""The checks on a pipeline's stages as a list: what no single stage can see.

Kinds in the order a step runs them and exactly one generate stage, unique names, every
column read written by an upstream stage (in the order of :func:`execution_order`), one
owner per exclusive decision, and each stage's own ``check_pipeline`` rule (the
``PipelineRule`` capability). :func:`gfcr.core.pipeline.check` runs them with the checks
on components, engine and sizes when a pipeline is built.
"""

from __future__ import annotations

from typing import Iterable

from gfcr.core.capabilities import PipelineRule
from gfcr.core.rollout import PLAN_COLUMNS, PROMPT_COLUMNS
from gfcr.core.stage import ON_SEGMENT, PHASES, REFILL, STAGE_ORDER, Stage, StageSpec


def check_stages(stages: list[StageSpec], problems: list[str], *, reserved: set[str]) -> None:
    """Append every problem of ``stages`` as a list to ``problems``; ``reserved``: the
    pipeline's own field names, which no stage may take as its name."""
    _check_order(stages, problems)
    _check_names(stages, problems, reserved)
    _check_columns(stages, problems)
    _check_owners(stages, problems)
    _check_stage_rules(stages, problems)


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


def _check_names(stages: list[StageSpec], problems: list[str], reserved: set[str]) -> None:
    seen: set[str] = set()
    for s in stages:
        if s.label in seen:
            problems.append(f"stage name {s.label!r} is used twice; give one a `name`")
        if s.label in reserved:
            problems.append(f"stage name {s.label!r} clashes with the pipeline field of "
                            "that name; give it another `name`")
        seen.add(s.label)


def execution_order(stages: Iterable[StageSpec]) -> list[tuple[str, Stage]]:
    """(phase, stage) in the order the loop runs them (gfcr.core.stage.PHASES: select,
    allocate, generate, apply, augment, learner; on_segment hooks run inside generate and
    shortfall after the filters, so they are not listed)."""
    stages = list(stages)
    return [(phase.method, s) for phase in PHASES if phase not in (ON_SEGMENT, REFILL)
            for s in phase.of(stages)]


def _check_columns(stages: list[StageSpec], problems: list[str]) -> None:
    available = set(PROMPT_COLUMNS) | PLAN_COLUMNS
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
        if isinstance(s, PipelineRule):
            problems.extend(s.check_pipeline(tuple(stages)))


DECISIONS = {
    "stop": "which in-flight rollouts end early and are kept as partial rollouts",
    "prune": "which in-flight rollouts are discarded",
    "n": "how many samples each prompt gets",
    "max_tokens": "each prompt's token cap",
    "max_turns": "each episode's turn cap",
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
