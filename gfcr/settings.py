"""A pipeline's run settings that are not stages: held-out evaluation and checkpointing."""

from __future__ import annotations

from pydantic import Field

from gfcr.stage import Spec


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
