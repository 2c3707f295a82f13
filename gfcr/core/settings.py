"""A pipeline's run settings that are not stages: held-out evaluation, checkpointing,
the range of rewards and where the learner runs."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from gfcr.core import names
from gfcr.core.stage import Spec
from gfcr.core.registry import lookup


class Sampled(Spec):
    """A sampled evaluation beside the greedy one: ``samples`` completions per prompt at
    ``temperature``, giving the mean reward and pass@k for each k of ``pass_at``
    (gfcr.evaluation.heldout.pass_at_k: the unbiased estimator of Chen et al. 2021,
    "Evaluating Large Language Models Trained on Code"). Every evaluation of a run
    samples under the same seed (the run's), so two steps are compared on the same noise."""

    samples: int = Field(8, ge=1, le=1024)
    """Completions drawn per prompt (n of the estimator)."""
    temperature: float = Field(1.0, gt=0.0, le=10.0)
    pass_at: tuple[int, ...] = (1,)
    """The k of each pass@k reported (each at most ``samples``); ``samples`` itself is
    always reported too."""

    @model_validator(mode="after")
    def _ks(self) -> "Sampled":
        bad = [k for k in self.pass_at if not 1 <= k <= self.samples]
        if bad:
            raise ValueError(f"pass_at {bad!r}: each k must lie in 1..samples={self.samples!r}")
        return self

    @property
    def ks(self) -> tuple[int, ...]:
        """The k reported: ``pass_at`` and ``samples``, ascending, once each."""
        return tuple(sorted({*self.pass_at, self.samples}))


class EvalSet(Spec):
    """A further evaluation set: a task's prompts (all of them: training and held-out
    splits, e.g. a user's benchmark file as a ``FileTask``), scored by that task, at the
    start, every ``every`` steps and after the last. Its rows are stored under its
    ``name`` (``evaluations.eval_set``, ``eval_completions.eval_set``)."""

    name: str
    task: Any
    """A task config (a mapping with a ``type`` in YAML), e.g. ``{type: file, path: ...}``."""
    every: int = Field(0, ge=0)
    """Evaluate every N steps as well; 0 means only before and after."""
    size: int | None = Field(None, ge=1)
    """Prompts evaluated (None: all)."""

    @field_validator("name")
    @classmethod
    def _plain(cls, value: str) -> str:
        if value == "heldout" or names.problem("name", value) is not None:
            raise ValueError(f"eval set name {value!r}: not 'heldout' (the task's own); "
                             f"{names.rule()}")
        return value

    @field_validator("task", mode="before")
    @classmethod
    def _resolve(cls, value: object) -> object:
        if isinstance(value, dict) and "type" in value:
            return lookup("task", value["type"]).model_validate(value)
        if not isinstance(value, Spec):
            raise ValueError(f"expected a task config (a mapping with a 'type'), got {value!r}")
        return value


class Evaluation(Spec):
    """Held-out greedy evaluation, run before the first step, every ``every`` steps and
    after the last; with ``sampled``, also mean reward and pass@k at a temperature; with
    ``sets``, further evaluation sets. Every completion is stored (``eval_completions``).
    ``sampled``, ``sets`` and ``initial`` are in the spec only when set, so older specs
    keep their hash."""

    size: int = Field(64, ge=1)
    """Number of held-out prompts (taken from the task's held-out split)."""
    every: int = Field(0, ge=0)
    """Evaluate every N steps as well; 0 means only before and after."""
    max_tokens: int = Field(16, ge=1)
    sampled: Sampled | None = None
    """Sampled evaluation (mean reward, pass@k) besides greedy accuracy; None: greedy only."""
    sets: tuple[EvalSet, ...] = ()
    """Further evaluation sets, each with its own task and schedule."""
    initial: bool = True
    """Evaluate before the warm start too (label ``initial``); False skips it where its
    figure is known and costly (a raw model that rambles to ``max_tokens`` on every
    prompt), and the run's summary starts from the warm start. Without a warm start
    there is no such evaluation either way."""

    @field_validator("sets", mode="before")
    @classmethod
    def _listlike(cls, value: object) -> object:
        return tuple(value) if isinstance(value, list) else value

    @model_validator(mode="after")
    def _distinct(self) -> "Evaluation":
        seen = [s.name for s in self.sets]
        if len(set(seen)) != len(seen):
            raise ValueError(f"sets: names {seen!r} repeat; each set needs its own name")
        return self

    def spec(self) -> dict[str, Any]:
        """Plain data for the pipeline spec: ``sampled``, ``sets`` and ``initial`` only when set."""
        out = self.model_dump(mode="json", exclude={"sampled", "sets", "initial"})
        if not self.initial:
            out["initial"] = False
        if self.sampled is not None:
            out["sampled"] = self.sampled.model_dump(mode="json")
        if self.sets:
            out["sets"] = [s.model_dump(mode="json") for s in self.sets]
        return out


class Checkpointing(Spec):
    """When a run saves a checkpoint (see :mod:`gfcr.checkpoints.checkpoint`): after every ``every``
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
