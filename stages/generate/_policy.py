"""Teacher-forced passes over the engine's policy, for the generators that need more than
the engine protocol returns (the sampled tokens' logprobs).

- :func:`branch_points` (tree rollouts): the policy's next-token distributions along a
  finished path, to find where it was uncertain. vLLM's ``logprobs=k`` top-k output would
  serve the same purpose.
- :func:`forced_logprobs` (hints): the behaviour logprobs of tokens the policy did not
  sample but is made to continue from.

Both run the one teacher-forced pass (:mod:`stages.logprobs`) on ``engine.policy.model``
(the HF engine exposes it) under the engine's convention, ``log_softmax(logits / T)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class BranchPoint:
    """An uncertain position of a path: ``token`` is the runner-up candidate there."""

    pos: int
    """Index into the path's completion ids where the branch replaces the token."""
    token: int
    logprob: float
    """``log_softmax(logits / T)`` of ``token``: its behaviour logprob under the policy."""
    prob: float


def branch_points(engine: Any, prompts: list[list[int]], completions: list[list[int]],
                  starts: list[int], *, temperature: float, min_prob: float
                  ) -> list[list[BranchPoint]]:
    """For each path, the positions ``>= start`` where the most likely token other than
    the one taken has probability ``>= min_prob`` (LATR's branching condition), with
    that token. Probabilities are at ``temperature`` (1 when sampling greedily)."""
    import torch

    from stages.logprobs import completion_logits

    model = _model(engine)
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            logits, _, _ = completion_logits(model, prompts, completions, temperature,
                                             _pad_id(engine))
    finally:
        model.train(was_training)
    logp = torch.log_softmax(logits, -1)  # completion_logits divided by T already
    top_lp, top_ids = logp.topk(2, dim=-1)
    out: list[list[BranchPoint]] = []
    for i, c in enumerate(completions):
        lp, tk = top_lp[i, :len(c)].tolist(), top_ids[i, :len(c)].tolist()
        points = []
        for j in range(starts[i], len(c)):
            alt = 1 if tk[j][0] == c[j] else 0  # the best candidate other than the taken one
            prob = math.exp(lp[j][alt])
            if prob >= min_prob and tk[j][alt] != c[j]:
                points.append(BranchPoint(j, int(tk[j][alt]), float(lp[j][alt]), prob))
        out.append(points)
    return out


def _pad_id(engine: Any) -> int:
    # getattr: tokenizers without a pad token pad with 0
    return int(getattr(engine.policy.tokenizer, "pad_token_id", 0) or 0)


def _model(engine: Any) -> Any:
    # getattr: teacher-forced passes need the in-process policy; a declared engine
    # capability for it belongs to the engine protocol (issue 14)
    policy = getattr(engine, "policy", None)
    # getattr: (same: the policy must hold a model)
    if policy is None or not hasattr(policy, "model"):
        raise TypeError(f"tree rollouts need an engine that exposes its policy (the HF "
                        f"engine does); {type(engine).__name__} does not")
    return policy.model


def forced_logprobs(engine: Any, prompt_ids: list[int], ids: list[int],
                    temperature: float) -> list[float]:
    """``log_softmax(logits / T)`` of each of ``ids`` after ``prompt_ids`` (raw logits
    when ``T == 0``): what the engine would have recorded had it sampled them."""
    import torch

    from stages.logprobs import completion_logprobs

    if not ids:
        return []
    model = _model(engine)
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            logprobs, _ = completion_logprobs(model, [prompt_ids], [ids], temperature,
                                              _pad_id(engine))
            return logprobs[0, :len(ids)].tolist()
    finally:
        model.train(was_training)
