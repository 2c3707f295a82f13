"""A pipeline's run settings that are not stages: held-out evaluation, checkpointing,
the range of rewards and where the learner runs."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from gfcr.core.stage import Spec


class Evaluation(Spec):
    """Held-out greedy evaluation, run before the first step, every ``every`` steps and
    after the last."""

    size: int = Field(64, ge=1)
    """Number of held-out prompts (taken from the task's held-out split)."""
    every: int = Field(0, ge=0)
    """Evaluate every N steps as well; 0 means only before and after."""
    max_tokens: int = Field(16, ge=1)


class Checkpointing(Spec):
    """When a run saves a checkpoint (see :mod:`gfcr.runner.checkpoint`): after every ``every``
    steps and after the last, keeping the newest ``keep``. A run resumes from the newest
    complete one; these settings may change when a run is resumed."""

    every: int = Field(10, ge=0)
    """Save after every N steps; 0 saves only after the last step."""
    keep: int = Field(2, ge=1)
    """Complete checkpoints kept per run; older ones are deleted once a newer one is whole."""


class RewardRange(Spec):
    """The range every reward of a step must lie in, checked after the filters (the
    reward a learner sees is the sum of the stages' components: a verifier's score, a
    length penalty, ...). A reward outside it is clipped to it, and with ``drop`` its
    rollout is also dropped from training; either way the step warns and records the count
    as the step metric ``reward_out_of_range`` (gfcr.runner.rewards). The default is far wider
    than any shipped scorer's [0, 1] plus penalties, and far inside what float64
    advantages and losses hold (a reward of 1e308 made the weights NaN)."""

    low: float = Field(-1e6, ge=-1e9, le=1e9)
    high: float = Field(1e6, ge=-1e9, le=1e9)
    out_of_range: Literal["clip", "drop"] = "clip"

    @model_validator(mode="after")
    def _ordered(self) -> "RewardRange":
        if self.low > self.high:
            raise ValueError(f"low={self.low!r} must not be above high={self.high!r}")
        return self


class LearnerPlacement(Spec):
    """Where the train stage's learner runs: in the run's process (``ranks=0``, the
    default), or sharded with FSDP2 over ``ranks`` processes started beside
    it (gfcr.transport.sharded): each holds a shard of the weights, gradients and optimizer state,
    so a policy too large for one device trains on several. The losses mean the same in
    both (stages.train.ranks)."""

    ranks: int = Field(0, ge=0, le=1024)
    """0: in this process; N: an FSDP2 process group of N ranks on this host."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where the ranks compute: ``auto`` is one GPU per rank when there are GPUs (NCCL,
    bf16 mixed precision), else the CPU (gloo)."""
    offload: bool = False
    """Keep the shards and the optimizer state in CPU memory between uses
    (FSDP2's CPUOffloadPolicy): larger models for slower steps."""
    timeout_s: float = Field(1800.0, gt=0.0)
    """The longest one learner call (an update, a checkpoint) or collective may take
    before the run fails instead of hanging."""
