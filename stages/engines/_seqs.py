"""A request's state while an engine generates it, shared by the HF and vLLM engines:
validation of the requests, the in-flight view a segment hook sees, and how a hook's
decisions end sequences (stop -> ``aborted``, prune -> ``pruned``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gfcr.core.engine import Decision, GenOutput, GenRequest, Inflight, SamplingParams, SegmentHook

DECISION_REASON: dict[str, str] = {"stop": "aborted", "prune": "pruned"}


def context_of(model: Any) -> int | None:
    """A transformers model's context in tokens (its config's ``max_position_embeddings``;
    None when the config has none): the engines' ``context_length``."""
    value = model.config.to_dict().get("max_position_embeddings")
    return int(value) if isinstance(value, int) and value > 0 else None


@dataclass
class Seq:
    """One request's state during a call."""

    req: GenRequest
    budget: int
    """New tokens this call may still add (cap minus prefix)."""
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    tops: list[list[tuple[int, float]]] = field(default_factory=list)
    """With ``SamplingParams.top_logprobs``: the top (token, logprob) pairs per new token."""
    reason: str | None = None
    seconds: float = 0.0
    scan_from: int = 0
    """Stop strings are looked for in the completion text from here on (HF engine)."""

    def view(self) -> Inflight:
        return Inflight(key=self.req.key, completion_ids=self.req.prefix_ids + self.ids,
                        logprobs=self.req.prefix_logprobs + self.logprobs,
                        new_tokens=len(self.ids))


def output(s: Seq, version: int, params: SamplingParams) -> GenOutput:
    """The finished sequence as the engine returns it (prefix included; with
    ``top_logprobs``, an empty top-k list for each prefix token)."""
    none: list[list[tuple[int, float]]] = [[] for _ in s.req.prefix_ids]
    tops = none + s.tops if params.top_logprobs else []
    return GenOutput(key=s.req.key, completion_ids=s.req.prefix_ids + s.ids,
                     logprobs=s.req.prefix_logprobs + s.logprobs,
                     finish_reason=s.reason,  # type: ignore[arg-type]
                     version_start=version, version_end=version, seconds=s.seconds,
                     top_logprobs=tops)


def new_seq(req: GenRequest, params: SamplingParams) -> Seq:
    """Validate one request; one whose cap leaves no room finishes at once ("length")."""
    if len(req.prefix_logprobs) != len(req.prefix_ids):
        raise ValueError(f"request key={req.key!r}: {len(req.prefix_ids)!r} prefix_ids but "
                         f"{len(req.prefix_logprobs)!r} prefix_logprobs")
    if not req.prompt_ids and not req.prefix_ids:
        raise ValueError(f"request key={req.key!r} has no prompt or prefix tokens")
    cap = params.max_tokens if req.max_tokens is None else req.max_tokens
    seq = Seq(req=req, budget=cap - len(req.prefix_ids))
    if seq.budget <= 0:
        seq.reason = "length"
    return seq


def check_keys(requests: list[GenRequest]) -> None:
    """Keys must be unique: hook decisions and results are matched by them."""
    seen: set[int] = set()
    for r in requests:
        if r.key in seen:
            raise ValueError(f"request key {r.key!r} appears twice; keys must be unique")
        seen.add(r.key)


def ask_hook(hook: SegmentHook, running: list[Seq], now: float) -> None:
    """Show the unfinished sequences to the hook and end the ones it stops or prunes at
    ``now`` (seconds into the call); keys it returns that are not running are ignored."""
    if not running:
        return
    decisions: dict[int, Decision] = hook([s.view() for s in running]) or {}
    for s in running:
        decision = decisions.get(s.req.key, "continue")
        if decision == "continue":
            continue
        if decision not in DECISION_REASON:
            raise ValueError(f"segment hook returned {decision!r} for key {s.req.key!r}; "
                             f"expected 'continue', 'stop' or 'prune'")
        s.reason, s.seconds = DECISION_REASON[decision], now
