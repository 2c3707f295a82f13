"""What the GRPO learner (stages.train.learner) and its forward passes
(stages.train.passes) read of the train stage: its options, flat, as the stage builds
them (stages.train.grpo)."""

from __future__ import annotations

from dataclasses import dataclass

from stages.train.loss import Aggregation, RatioLevel
from stages.train.optim import Precision, Schedule


@dataclass(frozen=True)
class LearnerOptions:
    """What the learner needs, flat: the train stage's options (see
    :class:`stages.train.grpo.GRPO` for each one's meaning) and its label for errors. The
    stage builds it, so the learner knows no config class and no method by name."""

    label: str
    lr: float
    advantage: str
    clip_low: float
    clip_high: float
    aggregation: Aggregation
    norm_tokens: int | None
    ratio_level: RatioLevel
    epochs: int
    micro_batch: int
    micro_batch_tokens: int | None
    max_grad_norm: float
    temperature: float
    lr_schedule: Schedule
    warmup_steps: int
    total_steps: int | None
    precision: Precision
    kl_coef: float
    entropy_coef: float
    tis_cap: float | None
    token_selector: str = "d3s"
    gradient_checkpointing: bool = False
    offload_optimizer: bool = False
