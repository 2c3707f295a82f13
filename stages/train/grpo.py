"""GRPO: group-relative advantages and the clipped policy-gradient update.

GRPO (Shao et al. 2024, DeepSeekMath) with the options of its successors: clip-higher and
token-level aggregation (DAPO, Yu et al. 2025), the mean-only advantage and the
constant-normalised aggregation (Dr. GRPO, Liu et al. 2025), the sequence-level ratio
(GSPO, Zheng et al. 2025), the k3 KL to a frozen reference (GRPO's own term, off by
default as in DAPO and Dr. GRPO), an entropy bonus, and any estimator of
:mod:`stages.advantages` (GDPO gets the ``rewards`` components).

What the learner adds around the loss (:mod:`stages.train.loss`):

- **loss masks** from upstream stages, when their column is in the batch: forced hint
  tokens (``hint_tokens``, ADHint) and D³S's token share (``token_keep_ratio``); see
  :mod:`stages.train.masks`;
- **upstream advantages**: D³S's whole-group ``d3s_advantage``, where a row carries one,
  replaces the estimator's advantage as is (loss, token ranking and stored
  ``advantage``); see :meth:`stages.train.masks.BatchMarks.advantages`;
- **off-policy correction** for replayed and stale rows: decoupled PPO with a truncated
  importance weight (AReaL, Fu et al. 2025; IMPALA, Espeholt et al. 2018); see
  :mod:`stages.train.offpolicy`;
- **mechanics**: micro-batches under a sequence count and a token budget with gradient
  accumulation equal to the full-batch gradient (:mod:`stages.train.batching`), AdamW,
  a warm-up + constant/linear/cosine learning-rate schedule, gradient-norm clipping,
  optional bf16 autocast (:mod:`stages.train.optim`); fused AdamW on CUDA and the device
  and dtype read from the model at every update (:mod:`stages.train.device`);
- **memory** at a real vocabulary: completion logprobs from the hidden states, the output
  layer applied a chunk of tokens at a time under activation checkpointing (no batch x
  length x vocabulary float32 logits, :mod:`stages.logprobs`), optional gradient
  checkpointing, and each step's peak memory as ``peak_memory_mb``
  (:mod:`stages.train.memory`).

Departure, intended: when the loss has no KL and no entropy term (``kl_coef`` and
``entropy_coef`` 0, the default), rows whose advantage is exactly 0 (flat groups, MC-GRPO's
pivots, see :mod:`stages.advantages`) carry no gradient; they are not forwarded at
all, and the loss is averaged over the rows that carry signal (``seq_mean``'s 1/G counts
those rows, not the group), so the step size does not shrink with the share of flat groups
(the effect DAPO's dynamic sampling has when it refills the batch). With a KL or entropy
term every row carries gradient through it, so no row is dropped and the 1/G is GRPO's.

>>> GRPO(lr=1e-3, clip_high=0.28, aggregation="token_mean")  # doctest: +ELLIPSIS
GRPO(name=None, type='grpo', lr=0.001, ...)
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from gfcr.core.capabilities import SamplingTemperature
from gfcr.core.policy import Policy
from gfcr.core.rollout import col
from gfcr.core.sharding import RankPlace, RankWorker, ShardSetup
from gfcr.core.stage import StageSpec
from gfcr.core.registry import register
from stages.advantages import known_advantage
from stages.train.forward import sequence_logprobs
from stages.train.learner import GRPOLearner
from stages.train.options import LearnerOptions
from stages.train.lora import LoraSpec, LoraTraining
from stages.train.selection import known_token_selector
from stages.train.loss import Aggregation, RatioLevel
from stages.train.optim import Precision, Schedule

__all__ = ["GRPO", "GRPOLearner", "LoraSpec", "sequence_logprobs"]


@register("train")
class GRPO(StageSpec):
    """Group-relative policy optimisation (Shao et al. 2024) with PPO clipping.

    ``temperature`` must equal the sampling temperature: the new logprobs are
    ``log_softmax(logits / T)``, the engine's convention for the behaviour logprobs. The
    pipeline checks this when it is built (:meth:`check_pipeline`).
    ``epochs`` optimizer steps per update over the whole batch, each accumulated over
    micro-batches; AdamW with betas (0.9, 0.999), no weight decay.
    """

    type: Literal["grpo"] = "grpo"
    lr: float = Field(1e-4, gt=0.0, le=1.0)
    """Peak learning rate. The ready pipelines use 1e-5 (``pipelines.default.LR``): on the
    embedded default's 0.67M tiny Llama 1e-4 loses ~10 points of held-out accuracy in 10
    steps (BENCHMARKS.md, "Learning")."""
    advantage: str = "grpo"
    """Name in the advantage registry (stages.advantages), e.g. grpo, drgrpo, rloo,
    gdpo (per-component normalisation of the ``rewards`` map)."""
    clip_low: float = Field(0.2, gt=0.0, lt=1.0)
    """Lower clip of the ratio (PPO's epsilon)."""
    clip_high: float = Field(0.28, gt=0.0)
    """Upper clip; above ``clip_low`` is DAPO's clip-higher. With ``ratio_level="sequence"``
    use GSPO's ranges (3e-4 / 4e-4), not PPO's."""
    aggregation: Aggregation = "seq_mean"
    """seq_mean (GRPO), token_mean (DAPO) or seq_mean_token_sum_norm (Dr. GRPO)."""
    norm_tokens: int | None = Field(None, ge=1)
    """The seq_mean_token_sum_norm constant (Dr. GRPO uses the generation budget);
    None: the batch's longest completion."""
    ratio_level: RatioLevel = "token"
    """token (PPO/GRPO) or sequence (GSPO's length-normalised sequence ratio)."""
    epochs: int = Field(1, ge=1)
    """Optimizer steps on each batch (off-policy rows keep one proximal policy for all)."""
    micro_batch: int = Field(64, ge=1)
    """Most sequences in one micro-batch."""
    micro_batch_tokens: int | None = Field(None, ge=1)
    """Token budget of one micro-batch: rows x longest prompt + completion in it; None:
    no budget. A sequence longer than the budget is a micro-batch of its own."""
    max_grad_norm: float = Field(1.0, gt=0.0)
    """Gradient-norm clipping (the norm before clipping is reported as ``grad_norm``)."""
    temperature: float = Field(1.0, gt=0.0)
    """The generate stage's sampling temperature (see the class docstring)."""
    lr_schedule: Schedule = "constant"
    """constant, or linear / cosine decay to 0 at ``total_steps`` (after the warm-up)."""
    warmup_steps: int = Field(0, ge=0)
    """Steps of linear learning-rate warm-up."""
    total_steps: int | None = Field(None, ge=1)
    """Steps the schedule spans; needed by linear and cosine (the learner is not told the
    pipeline's ``steps``: set it to that)."""
    precision: Precision = "fp32"
    """fp32, or bf16 autocast of the forward passes (weights and optimizer stay fp32)."""
    kl_coef: float = Field(0.0, ge=0.0)
    """Weight of the k3 KL to a frozen copy of the policy taken at the first update (after
    any warm start); 0 makes no copy."""
    entropy_coef: float = Field(0.0, ge=0.0)
    """Weight of the entropy bonus (raises the policy's token entropy)."""
    tis_cap: float | None = Field(2.0, gt=0.0)
    """Truncation of the importance weight of off-policy rows (decoupled PPO, see
    stages.train.offpolicy); None: no correction, stale rows are trained like fresh ones
    against their behaviour logprobs."""
    token_selector: str = "d3s"
    """Name in the token-selector registry (stages.train.selection) that picks the loss
    tokens when the batch carries a ``token_keep_ratio`` below 1 (D³S writes one)."""
    gradient_checkpointing: bool = False
    """Recompute each layer's activations in the backward instead of keeping them
    (transformers' gradient checkpointing): less memory for about one more forward."""
    offload_optimizer: bool = False
    """Keep AdamW's state (8 bytes a trained weight) in host memory between updates,
    brought to the weights' device for each update and sent back after it: room on a GPU
    shared with the engine (vLLM's KV cache) for a host round trip per update."""
    lora: LoraSpec | None = None
    """Train a LoRA adapter over the frozen policy instead of every weight (peft; see
    stages.train.lora): the optimizer, the checkpoints and the weight sync then hold the
    adapter only. None: full fine-tuning."""

    reads: ClassVar[frozenset[str]] = frozenset(
        {col.REWARD, col.GROUP_ID, col.PROMPT_IDS, col.COMPLETION_IDS, col.LOGPROBS})
    writes: ClassVar[frozenset[str]] = frozenset({col.ADVANTAGE})

    @field_validator("advantage")
    @classmethod
    def _known_advantage(cls, value: str) -> str:
        return known_advantage(value)

    @field_validator("token_selector")
    @classmethod
    def _known_token_selector(cls, value: str) -> str:
        return known_token_selector(value)

    @model_validator(mode="after")
    def _schedule_is_complete(self) -> "GRPO":
        if self.lr_schedule != "constant" and self.total_steps is None:
            raise ValueError(f"stage {self.label!r}: lr_schedule={self.lr_schedule!r} needs "
                             "total_steps (the pipeline's steps); got total_steps=None")
        if self.total_steps is not None and self.warmup_steps >= self.total_steps > 1:
            raise ValueError(f"stage {self.label!r}: warmup_steps={self.warmup_steps!r} must "
                             f"be below total_steps={self.total_steps!r}")
        return self

    def check_pipeline(self, stages: tuple[StageSpec, ...]) -> list[str]:
        """The generate stage's sampling temperature must be ``temperature`` (greedy
        sampling records logprobs at temperature 1), or the ratio would compare logprobs
        at two temperatures. Reads ``temperature`` or ``sample.temperature`` of the
        generate stage (the shipped ones); a stage with neither is not checked."""
        problems = []
        for s in stages:
            sampled = _sampling_temperature(s) if s.kind == "generate" else None
            if sampled is None:
                continue
            behaviour = sampled if sampled > 0 else 1.0
            if behaviour != self.temperature:
                problems.append(
                    f"stage {self.label!r}: field 'temperature' is {self.temperature!r} but "
                    f"generate stage {s.label!r} samples at temperature {sampled!r}, so its "
                    f"logprobs are at temperature {behaviour!r}; set "
                    f"{self.label}.temperature={behaviour!r}")
        return problems

    def learner(self, policy: Policy, *, seed: int) -> GRPOLearner:
        """A learner with AdamW over ``policy.model`` (updated in place)."""
        names = {f.name for f in dataclasses.fields(LearnerOptions)} - {"label"}
        options = LearnerOptions(label=self.label, **self.model_dump(include=names))
        lora = None if self.lora is None else LoraTraining(self.lora.peft_config(), policy,
                                                           seed=seed)
        return GRPOLearner(options, policy, seed=seed, lora=lora)

    def rank_worker(self, setup: ShardSetup, place: RankPlace) -> RankWorker:
        """This stage's learner on one rank of a sharded learner
        (gfcr.core.sharding.ShardedTrainer): an FSDP2 shard, stages.train.fsdp_rank."""
        from stages.train.fsdp_rank import Rank  # torch.distributed: on the ranks only

        return Rank(self, setup, place)


def _sampling_temperature(stage: StageSpec) -> float | None:
    """The sampling temperature a generate stage declares, or None."""
    return stage.sampling_temperature() if isinstance(stage, SamplingTemperature) else None
