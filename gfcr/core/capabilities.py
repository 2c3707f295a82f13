"""Capabilities, checked when a pipeline is built: the engine's, and optional stage
protocols (checked with ``isinstance``, never looked up by name).

Engine capabilities:

An engine spec declares what its engine can do (``capabilities``); a stage declares what
it needs from the engine (``StageSpec.engine_needs``; a control stage with an
``on_segment`` hook needs ``"segments"`` without saying so). A pipeline whose engine
lacks something one of its stages needs is refused, naming the stage, the engine and
the capability, before anything runs.

- ``segments``: generation in segments with an in-flight hook (stop, prune, waves);
- ``continuation``: a request's ``prefix_ids`` continued (partial rollouts, branches);
- ``top_k``: ``SamplingParams.top_logprobs=k`` honoured, the k most likely tokens and
  their logprobs at every generated position (TreeRollout's branch points, from the
  engine's own distributions: no second pass);
- ``teacher_forcing``: ``forced_logprobs(prompt_ids, ids, temperature)`` on the engine
  (:class:`TeacherForcing`), a teacher-forced pass at the weights it generates with
  (Hints' forced-token logprobs: the logprobs, at the sampling temperature, of tokens
  the policy did not sample; top-k cannot give them, and vLLM's prompt logprobs are
  taken before temperature, so only a pass over the policy can).
"""

from __future__ import annotations

from pathlib import Path
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, ClassVar, Protocol, runtime_checkable

from gfcr.core.engine import Engine
from gfcr.core.policy import Policy
from gfcr.core.stage import OnSegment, StageSpec

if TYPE_CHECKING:  # services imports this module's neighbours; a handle is only named here
    from gfcr.core.services import WeightHandle

CAPABILITIES = frozenset({"segments", "continuation", "top_k", "teacher_forcing"})


@runtime_checkable
class EngineSpec(Protocol):
    """An engine's config: builds the engine and says what it can do."""

    capabilities: ClassVar[frozenset[str]]

    def build(self, policy: Policy, *, seed: int) -> Engine: ...


@runtime_checkable
class DecodesTokens(Protocol):
    """A policy's config that can turn its token ids back into text without building the
    model (its tokenizer alone, from local files): how ``gfcr report`` and ``gfcr ui`` show
    every stored turn as text. ``decoder`` returns None where the tokenizer's files are not
    on this machine."""

    def decoder(self) -> Callable[[Sequence[int]], str] | None: ...


def needs(stage: StageSpec) -> frozenset[str]:
    """What ``stage`` needs from the engine."""
    extra = {"segments"} if stage.kind == "control" and isinstance(stage, OnSegment) else set()
    return stage.engine_needs | extra


def check_engine(engine: object, stages: list[StageSpec], problems: list[str]) -> None:
    """Append one problem per stage whose needs the engine does not meet."""
    have = engine.capabilities if isinstance(engine, EngineSpec) else frozenset()
    # getattr: an engine spec's registry name, when it is a registered config
    kind = getattr(engine, "type", type(engine).__name__)
    for s in stages:
        missing = sorted(needs(s) - have)
        if missing:
            problems.append(
                f"stage {s.label!r} needs the engine capability {', '.join(missing)} "
                f"(gfcr.core.capabilities), which engine {kind!r} does not declare (it has "
                f"{', '.join(sorted(have)) or 'none'}); use an engine that has it, e.g. hf "
                f"or vllm, or drop the stage")


@runtime_checkable
class PipelineRule(Protocol):
    """Optional on any stage: rules it states about the other stages of its pipeline
    (e.g. a train stage's temperature must be the generate stage's), checked when the
    pipeline is built; each problem names the stage, field and value."""

    def check_pipeline(self, stages: tuple[StageSpec, ...]) -> list[str]: ...


@runtime_checkable
class PlanDefaults(Protocol):
    """Optional on a generate stage: the ``n`` and ``max_tokens`` a plan row without its
    own gets (gfcr.core.rollout.PLAN_N, PLAN_MAX_TOKENS); allocate stages see them filled in."""

    def plan_defaults(self) -> dict[str, int]: ...


@runtime_checkable
class ContinuesPartials(Protocol):
    """Optional on a generate stage: whether it honours the plan's ``recycle`` column
    (gfcr.core.rollout.RECYCLE), continuing recycled partial rollouts; a stage that brings
    them back requires it when the pipeline is built."""

    @property
    def continues_partials(self) -> bool: ...


@runtime_checkable
class ContinuesBranches(Protocol):
    """Optional on a generate stage: whether it honours the plan's ``branch`` column
    (gfcr.core.rollout.BRANCH), starting episodes from stored turns; a stage that plans
    branches (Fission-GRPO's, stages.replay.fission) requires it when the pipeline is built."""

    @property
    def continues_branches(self) -> bool: ...


@runtime_checkable
class SamplingTemperature(Protocol):
    """Optional on a generate stage: the temperature it samples at (0: greedy), which a
    train stage's ratio must match (gfcr.core.engine's logprob convention)."""

    def sampling_temperature(self) -> float: ...


@runtime_checkable
class EngineRng(Protocol):
    """Optional on an engine: a sampling generator carried between calls, which a
    checkpoint saves and restores (gfcr.checkpoints.checkpoint)."""

    def get_rng_state(self) -> object: ...

    def set_rng_state(self, state: object) -> None: ...


@runtime_checkable
class WeightsDtype(Protocol):
    """Optional on an engine config: the dtype its engine holds weights in, when not the
    policy's, so versions published for it are written in that dtype (vLLM's)."""

    @property
    def weights_dtype(self) -> str: ...


@runtime_checkable
class EngineFleet(Protocol):
    """Optional on an engine config: its engine also runs as a fleet of servers
    (gfcr.transport.fleet.Fleet): ``fleet`` returns an engine over the servers at ``urls`` that
    also loads published weight versions (``load(folder, version, ident)``), sending the
    fleet's ``key`` with every call (None: servers without one, on loopback)."""

    def fleet(self, policy: Policy, urls: list[str], *, timeout_s: float, attempts: int,
              notify: Callable[[str], None], key: bytes | None = None) -> Engine: ...


@runtime_checkable
class TeacherForcing(Protocol):
    """Optional on an engine (the ``teacher_forcing`` capability): the behaviour
    logprobs of tokens it did not sample, by a teacher-forced pass at its weights."""

    def forced_logprobs(self, prompt_ids: list[int], ids: list[int],
                        temperature: float) -> list[float]: ...


@runtime_checkable
class ContextLength(Protocol):
    """Optional on an engine: the most tokens one sequence (prompt and completion) may
    hold, the policy's positions (None: not known). The agent endpoint refuses a longer
    conversation before rendering it (stages.endpoint._limits)."""

    def context_length(self) -> int | None: ...


@runtime_checkable
class EngineSleep(Protocol):
    """Optional on an engine: frees its accelerator memory while the learner updates, so
    engine and learner can share one GPU (vLLM's sleep mode, ``VLLM(sleep_mode=True)``).
    When ``sleep_mode`` is True the loop calls ``sleep()`` before the train stage's
    update and ``wake_up()`` after it (also when the update fails), before the weight
    sync (gfcr.runner.loop)."""

    @property
    def sleep_mode(self) -> bool: ...

    def sleep(self) -> None: ...

    def wake_up(self) -> None: ...


@runtime_checkable
class AdapterWeights(Protocol):
    """Optional on a train stage's learner: it trains an adapter over the policy's frozen
    weights (LoRA, stages.train.lora), so what it hands out and checkpoints is the adapter
    alone once it has one (gfcr.runner.inprocess.LocalLearner asks it first)."""

    @property
    def trains_adapter(self) -> bool:
        """Whether it trains an adapter (False: every weight, the methods below decline)."""
        ...

    def adapter_handle(self, version: int) -> WeightHandle | None:
        """The adapter as a gfcr.core.services.WeightHandle; None while there is none (the
        policy's whole weights are then the handle)."""
        ...

    def save_adapter(self, path: Path) -> bool:
        """Write the adapter to ``path``; False while there is none."""
        ...

    def load_adapter(self, path: Path) -> bool:
        """Load the adapter in ``path``; False when ``path`` holds whole weights."""
        ...


@runtime_checkable
class ExportsModel(Protocol):
    """A policy component whose policy, with a checkpoint's weights, can be written as a
    folder other tools load (``gfcr export``): ``export(policy, weights, out, lora=...,
    base=...)`` returns the files written. ``lora`` is ``merged`` or ``adapter`` (how a
    LoRA checkpoint is written); ``base(policy)`` rebuilds the base weights an adapter
    was trained on (the warm start) and is called only for an adapter checkpoint."""

    def build(self, *, seed: int) -> Policy: ...

    def export(self, policy: Policy, weights: Path, out: Path, *, lora: str,
               base: Callable[[Policy], None]) -> list[str]: ...
