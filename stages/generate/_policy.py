"""What the generators need from the policy beyond the sampled tokens' logprobs.

- :func:`branch_points` (tree rollouts): where a finished path was uncertain, from the
  engine's own top-2 logprobs at each generated position (``SamplingParams.top_logprobs``,
  the ``top_k`` engine capability: HF, vLLM's ``logprobs=k``). These are the distributions
  the path was sampled from, so no second pass over the policy is needed, and a branch
  token's behaviour logprob is the engine's, like every other sampled logprob.
- :func:`chat_tokenizer` (episodes, agents): the tokenizer that renders conversations,
  the run's policy's wherever the engine runs (in this process or a fleet of servers).
- :func:`forced_logprobs` (hints): the behaviour logprobs of tokens the policy did not
  sample but is made to continue from. No top-k list holds them (a hint token need not be
  among the most likely), and vLLM's prompt logprobs are taken before temperature, so
  they come from the engine's teacher-forced pass at the weights it generates with
  (the ``teacher_forcing`` capability, :mod:`stages.engines.teacher`), under the
  engine's convention, ``log_softmax(logits / T)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from gfcr.core.capabilities import TeacherForcing
from gfcr.core.engine import GenOutput


@dataclass(frozen=True)
class BranchPoint:
    """An uncertain position of a path: ``token`` is the runner-up candidate there."""

    pos: int
    """Index into the path's completion ids where the branch replaces the token."""
    token: int
    logprob: float
    """``log_softmax(logits / T)`` of ``token``: its behaviour logprob under the policy."""
    prob: float


def branch_points(outputs: list[GenOutput], starts: list[int], *, min_prob: float
                  ) -> list[list[BranchPoint]]:
    """For each path, the positions ``>= start`` where the most likely token other than
    the one taken has probability ``>= min_prob`` (LATR's branching condition), with
    that token, from the path's ``top_logprobs`` (generated with ``top_logprobs >= 2``;
    probabilities at the sampling temperature, 1 when greedy)."""
    out: list[list[BranchPoint]] = []
    for o, start in zip(outputs, starts):
        ids, tops = o.completion_ids, o.top_logprobs
        if len(tops) != len(ids) or not all(tops[j] for j in range(start, len(ids))):
            raise TypeError("tree rollouts need the top-2 logprobs at every generated "
                            "position (SamplingParams.top_logprobs, the engine capability "
                            "top_k); the engine returned fewer")
        points = []
        for j in range(start, len(ids)):
            # the best candidate other than the taken one (none: a one-token distribution)
            token, logprob = next(((t, lp) for t, lp in tops[j] if t != ids[j]), (-1, -math.inf))
            prob = math.exp(logprob)
            if token >= 0 and prob >= min_prob:
                points.append(BranchPoint(j, int(token), float(logprob), prob))
        out.append(points)
    return out


def forced_logprobs(engine: Any, prompt_ids: list[int], ids: list[int],
                    temperature: float) -> list[float]:
    """``log_softmax(logits / T)`` of each of ``ids`` after ``prompt_ids`` (raw logits
    when ``T == 0``): what the engine would have recorded had it sampled them."""
    if not isinstance(engine, TeacherForcing):
        raise TypeError(f"hints need an engine with teacher forcing (HF and vLLM have it); "
                        f"{type(engine).__name__} has no forced_logprobs")
    return list(engine.forced_logprobs(prompt_ids, ids, temperature))


def chat_tokenizer(engine: Any, stage: str) -> Any:
    """The tokenizer stage ``stage`` renders its conversations with: the engine's own
    (a fleet's is the run's policy's, gfcr.transport.fleet) or its policy's (HF and vLLM
    in this process); the engine then decodes with the same one."""
    tokenizer = getattr(engine, "tokenizer", None)  # getattr: engines outside gfcr's protocol
    if tokenizer is None:
        tokenizer = getattr(getattr(engine, "policy", None), "tokenizer", None)
    if tokenizer is None:
        raise TypeError(f"stage {stage!r} renders conversations with the policy's tokenizer; "
                        f"the engine {type(engine).__name__} exposes neither a tokenizer nor "
                        f"a policy (HF and vLLM in this process do, and so does a fleet of "
                        f"vLLM servers, gfcr.transport.fleet)")
    return tokenizer
