"""The engine protocol: what the loop needs from a generator, whatever backs it.

An engine turns token-id requests into completions, in *segments*: after every segment of
``SamplingParams.segment_tokens`` new tokens it shows the in-flight sequences to a hook,
which may stop (abort, keep as partial) or prune any of them. A request that carries
``prefix_ids`` continues a partial rollout from those tokens instead of starting afresh.
Engines also own the tokenizer and the policy version (``Policy.version``,
:mod:`gfcr.core.policy`), which advances on every weight update.

Logprob convention: the logprob of a sampled token is ``log_softmax(logits / T)`` at that
token, taken before top-p truncation: what a teacher-forced forward pass at the same
temperature computes, so the trainer's ratio is exact. vLLM's processed logprobs are
renormalised over the nucleus instead; the two agree at ``top_p=1``, which is what a
training pipeline should sample with. gfcr knows no concrete engine; ``stages/engines``
has the HF transformers one and the vLLM one, and ``tests/stages/engines/test_conformance.py``
is the contract every engine passes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, field_validator


class SamplingParams(BaseModel):
    """How to sample. Per-request ``max_tokens`` in a :class:`GenRequest` overrides it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    temperature: float = Field(1.0, ge=0.0)
    """0 means greedy."""
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    max_tokens: int = Field(32, ge=1)
    stop: tuple[str, ...] = ()
    """Generation of a sequence ends after it produces any of these (non-empty) strings."""
    segment_tokens: int = Field(16, ge=1)
    """Tokens generated between two calls of the in-flight hook."""
    seed: int | None = None
    top_logprobs: int = Field(0, ge=0, le=20)
    """The k most likely tokens to report at every generated position
    (``GenOutput.top_logprobs``), under the logprob convention; 0: none. Only engines
    whose spec declares the ``top_k`` capability honour it (gfcr.core.capabilities)."""

    @field_validator("stop")
    @classmethod
    def _non_empty(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if any(s == "" for s in value):
            raise ValueError("stop strings must be non-empty")
        return value


@dataclass(frozen=True)
class GenRequest:
    """One sequence to generate: a prompt, optionally continuing earlier tokens."""

    key: int
    """Caller's handle; results and hook views carry it back."""
    prompt_ids: list[int]
    prefix_ids: list[int] = field(default_factory=list)
    """Completion tokens already generated (a partial rollout being continued)."""
    prefix_logprobs: list[float] = field(default_factory=list)
    max_tokens: int | None = None
    """Total completion length cap, prefix included; None means SamplingParams.max_tokens."""
    group: str | None = None
    """Requests that share a prefix, such as a task's episodes (None: its prompt alone
    says): a fleet sends a group to one server, for its prefix cache; an engine in this
    process ignores it."""


class RequestRefused(ValueError):
    """An engine refused one request of a call for what the request itself holds (a
    prompt longer than a server's context: an HTTP 4xx): ``key`` names it, so a caller
    serving many clients in one call (gfcr's agent endpoint) fails that request alone
    and generates the others again without it."""

    def __init__(self, key: int, message: str) -> None:
        super().__init__(message)
        self.key = key


@dataclass
class GenOutput:
    """A finished (or stopped) sequence. ``completion_ids`` includes the prefix."""

    key: int
    completion_ids: list[int]
    logprobs: list[float]
    finish_reason: Literal["stop", "length", "aborted", "pruned"]
    version_start: int
    version_end: int
    seconds: float
    """Wall time from the start of the generate call to this sequence's end."""
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    """With ``SamplingParams.top_logprobs=k``: one entry per ``completion_ids`` token,
    the k most likely (token, logprob) pairs at that position, most likely first, under
    the logprob convention; empty for the prefix tokens the request came with."""
    server: str | None = None
    """Where its last tokens were generated: a fleet server's URL (the ``server``
    column, gfcr.core.rollout.SERVER); None: in this process."""


@dataclass(frozen=True)
class Inflight:
    """What an in-flight hook sees of one unfinished sequence after a segment."""

    key: int
    completion_ids: list[int]
    logprobs: list[float]
    new_tokens: int
    """Tokens generated so far in this call (the prefix not counted)."""


Decision = Literal["continue", "stop", "prune"]
"""stop: end the sequence and keep it as a partial rollout; prune: end and discard it."""

@runtime_checkable
class SegmentHook(Protocol):
    """What an engine calls while it generates (every engine, the same way).

    - ``wave(keys)``: before decoding requests, the engine names the ones it starts now
      (an engine that decodes in several waves calls it per wave; the first call also
      names requests that end without decoding, e.g. no room left). Hooks that count
      groups use it to tell a finished request from one not yet started.
    - ``__call__(inflight)``: after every segment of ``segment_tokens`` new tokens, with
      the unfinished sequences; returns decisions by key (keys left out continue).
    - ``expect(groups)``: called by a *generate stage*, not the engine, before it
      generates: request key -> group id, for hooks that count groups (APRIL, ARRoL).

    :class:`FnHook` turns a plain function into one.
    """

    def __call__(self, inflight: list[Inflight]) -> dict[int, Decision]: ...

    def wave(self, keys: list[int]) -> None: ...

    def expect(self, groups: dict[int, str]) -> None: ...


class FnHook:
    """A :class:`SegmentHook` from a decision function; waves and groups are ignored."""

    def __init__(self, fn: Callable[[list[Inflight]], dict[int, Decision]]) -> None:
        self.fn = fn

    def __call__(self, inflight: list[Inflight]) -> dict[int, Decision]:
        return self.fn(inflight)

    def wave(self, keys: list[int]) -> None:
        """Not needed by a hook that decides from the sequences it is shown."""

    def expect(self, groups: dict[int, str]) -> None:
        """Not needed by a hook that counts no groups."""


@dataclass
class Flight:
    """The whole generate call as in-flight hooks know it, kept by the loop between
    segments (``StepContext.flight``).

    An engine shows a hook only the unfinished sequences. Hooks that count groups (APRIL:
    stop once N groups are complete) or tokens (DUET: stop once the budget is spent) also
    need the rest: the group of every request (declared by the generate stage), which
    requests have ended and how, and the tokens each has generated in this call. A request
    no longer in flight that no hook stopped or pruned is taken as ``"finished"`` once it
    has started. Engines announce their waves (``SegmentHook.wave``, part of the engine
    contract), so ``started`` says which requests have started and this is exact over any
    number of waves: a request of a later wave is pending, not finished. Without announcements every
    request counts as started, which is exact only for a call decoded in one wave;
    ``split`` turns True when a request taken as finished shows up in flight later (a
    later wave), and counting hooks must refuse to decide then. Token counts of requests
    that finished between two segments are those of their last view (at most one segment
    low).
    """

    groups: dict[int, str] = field(default_factory=dict)
    """Request key -> group id, for every request of the call."""
    ended: dict[int, str] = field(default_factory=dict)
    """Request key -> "finished" | "stop" | "prune", for requests no longer in flight."""
    tokens: dict[int, int] = field(default_factory=dict)
    """Request key -> tokens generated in this call, as of its latest view."""
    started: set[int] | None = None
    """Requests the engine announced as started (:meth:`start`); None: it announces none."""
    split: bool = False

    def start(self, keys: list[int]) -> None:
        """The engine starts decoding (or ends at once) the requests ``keys``."""
        self.started = (self.started or set()) | set(keys)

    def observe(self, inflight: list[Inflight]) -> None:
        """Update the picture from the sequences in flight after a segment."""
        live = set()
        for view in inflight:
            live.add(view.key)
            if self.ended.pop(view.key, None) is not None:
                self.split = True
            self.tokens[view.key] = view.new_tokens
        for key in self.groups:
            pending = self.started is not None and key not in self.started
            if key not in live and key not in self.ended and not pending:
                self.ended[key] = "finished"

    def decided(self, decisions: dict[int, Decision], inflight: list[Inflight]) -> None:
        """Record the stops and prunes the engine will apply to sequences in flight."""
        for view in inflight:
            decision = decisions.get(view.key, "continue")
            if decision != "continue":
                self.ended[view.key] = decision

    def members(self) -> dict[str, list[int]]:
        """Group id -> its request keys."""
        out: dict[str, list[int]] = {}
        for key, group in self.groups.items():
            out.setdefault(group, []).append(key)
        return out

    def complete_groups(self) -> set[str]:
        """Groups all of whose requests have ended, none stopped, at least one finished."""
        done = set()
        for group, keys in self.members().items():
            ends = [self.ended.get(k) for k in keys]
            if None not in ends and "stop" not in ends and "finished" in ends:
                done.add(group)
        return done

    def spent(self) -> int:
        """Tokens generated in this call so far (see the class note on precision)."""
        return sum(self.tokens.values())


@runtime_checkable
class Engine(Protocol):
    """A generator the loop can drive. Implementations live in ``stages/engines``.

    Optional: ``get_rng_state()`` / ``set_rng_state(state)`` for a sampling generator the
    engine carries between calls (used when ``SamplingParams.seed`` is None); checkpoints
    save and restore it when present (:mod:`gfcr.checkpoints.checkpoint`).
    """

    @property
    def version(self) -> int:
        """Policy version of the weights in use; advances with every update."""
        ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...

    def generate(self, requests: list[GenRequest], params: SamplingParams,
                 on_segment: SegmentHook | None = None) -> list[GenOutput]:
        """Generate every request; outputs in request order."""
        ...

    def update_weights(self, state: object | None = None) -> int:
        """The explicit weight sync, called by the in-process generator when it loads a
        learner's handle (gfcr.runner.inprocess.SameTensors): after an update, the warm start
        and a checkpoint restore. ``state`` (a state dict), when given, is loaded into the
        policy first; None: the trainer already changed ``policy.model`` in place. An
        engine sharing that module (HF) only advances the version; one holding its own
        copy (vLLM) copies the policy's weights into it in place and drops what it
        computed with the old ones (prefix cache). Returns the new version."""
        ...


@runtime_checkable
class Tokenizer(Protocol):
    """The little of a tokenizer the runtime needs. Optional: ``encode_prompt(text)``
    (see :func:`encode_prompt`) and ``stop_token_ids`` (see :func:`stop_token_ids`)."""

    eos_token_id: int
    pad_token_id: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


class Encodes(Protocol):
    """What turns text into token ids: an engine or a tokenizer."""

    def encode(self, text: str) -> list[int]: ...


def encode_prompt(coder: Encodes, text: str) -> list[int]:
    """The ids of a task's prompt as the policy sees it. ``coder`` is an engine or a
    tokenizer; one with an ``encode_prompt`` method (a chat model's tokenizer: the prompt
    as a user message through the model's chat template, generation prompt added) uses
    it, any other plain ``encode``. Every stage that turns a prompt into ids calls this,
    so generation, evaluation and the warm start see the same ids."""
    own = getattr(coder, "encode_prompt", None)  # getattr: optional on Tokenizer/Engine
    return list(own(text)) if own is not None else list(coder.encode(text))


def stop_token_ids(tokenizer: Any) -> frozenset[int]:
    """The token ids that end a completion: ``eos_token_id`` and, where the tokenizer has
    them, its ``stop_token_ids`` (a chat model's end-of-turn tokens from its generation
    config)."""
    extra = getattr(tokenizer, "stop_token_ids", ())  # getattr: optional on Tokenizer
    return frozenset({int(tokenizer.eos_token_id), *map(int, extra)})
