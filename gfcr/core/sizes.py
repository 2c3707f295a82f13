"""What a pipeline asks of its task, checked when it is built: a held-out evaluation or a
step's prompt batch larger than the task holds is refused, naming the field and what the
task has, instead of evaluating on fewer prompts than asked or repeating prompts in a step.

A task tells its sizes by the optional :class:`PromptCounts` protocol, when it knows them
without drawing its prompts (reasoning-gym's ``train_size`` and ``heldout_size``); a task
that learns them only by reading its data (a JSON-lines file) is not checked here.
"""

from __future__ import annotations

from typing import Protocol, Sequence, runtime_checkable

from gfcr.config import yamlfile
from gfcr.core.settings import Evaluation


@runtime_checkable
class PromptCounts(Protocol):
    """A task that knows how many prompts each split holds: ``{"train": n, "heldout": m}``."""

    def prompt_counts(self) -> dict[str, int]: ...


@runtime_checkable
class PromptBatch(Protocol):
    """A select stage that draws ``batch`` distinct training prompts a step."""

    kind: str
    batch: int

    @property
    def label(self) -> str: ...


def check_sizes(task: object, evaluation: Evaluation, stages: Sequence[object],
                problems: list[str]) -> None:
    """Append a problem for each demand on ``task`` it cannot supply."""
    if not isinstance(task, PromptCounts):
        return
    counts = task.prompt_counts()
    held, train = counts.get("heldout"), counts.get("train")
    if held is not None and evaluation.size > held:
        problems.append(f"evaluation: {_field('size', ('evaluation', 'size'))} is "
                        f"{evaluation.size} but the task has {held} held-out prompts "
                        "(task.heldout_size); lower evaluation.size or raise "
                        "task.heldout_size")
    for i, s in enumerate(stages):
        if train is not None and isinstance(s, PromptBatch) and s.kind == "replay" and (
                isinstance(s.batch, int) and s.batch > train):
            problems.append(f"stage {s.label!r}: {_field('batch', ('stages', i, 'batch'))} "
                            f"is {s.batch} but the task has {train} training prompts "
                            "(task.train_size); a step draws distinct prompts, so lower "
                            "the batch or raise task.train_size")


def _field(name: str, path: tuple[object, ...]) -> str:
    """``field 'name'``, with ``at file:line`` in a YAML pipeline being built."""
    at = yamlfile.where(path)
    return f"field {name!r}" + (f" at {at}" if at else "")
