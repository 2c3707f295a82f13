"""Teacher forcing in the engine's process: the logprobs, at the sampling temperature, of
tokens the policy did not sample (the ``teacher_forcing`` engine capability).

No top-k list holds them (a forced token need not be among the most likely), and vLLM's
prompt logprobs are taken before temperature, so they come from one teacher-forced pass
(:mod:`stages.logprobs`) over the policy the engine generates with, under the engine's
convention ``log_softmax(logits / T)``: the behaviour logprobs of the forced tokens. (The
learner offers the same pass at its own weights, gfcr.core.services.Learner.logprobs; in an
asynchronous run those are newer than the ones that generated.)
"""

from __future__ import annotations

import torch

from gfcr.core.policy import Policy
from stages.logprobs import completion_logprobs


def forced_logprobs(policy: Policy, prompt_ids: list[int], ids: list[int],
                    temperature: float) -> list[float]:
    """``log_softmax(logits / T)`` of each of ``ids`` after ``prompt_ids`` (raw logits
    when ``T == 0``) under ``policy``: what the engine would have recorded had it sampled
    them."""
    if not ids:
        return []
    model = policy.model
    was_training = model.training
    model.eval()
    # getattr: tokenizers without a pad token pad with 0
    pad = int(getattr(policy.tokenizer, "pad_token_id", 0) or 0)
    try:
        with torch.inference_mode():
            logprobs, _ = completion_logprobs(model, [prompt_ids], [ids], temperature, pad)
            return logprobs[0, :len(ids)].tolist()
    finally:
        model.train(was_training)
