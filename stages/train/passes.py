"""The GRPO learner's forward passes of the policy over an update's rows
(stages.train.learner): micro-batched (:mod:`stages.train.batching`, one plan per update
and subset of rows), under the update's precision, with or without a gradient.

Besides the gradient pass of each micro-batch, three passes run without one: teacher
forcing at the current weights (the ``teacher_forcing`` capability,
gfcr.core.services.Learner.logprobs), the proximal logprobs of off-policy rows and the
token entropies the token selector ranks by (before the update), and the logprobs under
the frozen KL reference.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable

import numpy as np
import torch

from gfcr.core.policy import Policy
from stages.train.batching import plan
from stages.train.forward import sequence_logprobs, sequence_logprobs_entropy
from stages.train.lora import LoraTraining
from stages.train.loss import token_entropy
from stages.train.optim import autocast
from stages.train.options import LearnerOptions
from stages.train.work import Work


class Passes:
    """Forward passes of ``policy`` as the options say (micro-batch caps, temperature,
    precision, entropy bonus), on the device ``device()`` names at each pass (the engine
    may move the model; a sharded learner pins its own)."""

    def __init__(self, spec: LearnerOptions, policy: Policy,
                 device: Callable[[], torch.device]) -> None:
        self.spec, self.policy, self.device = spec, policy, device

    def micro_batches(self, work: Work, subset: list[int] | None = None) -> list[list[int]]:
        """The micro-batches of ``subset`` of ``work``'s rows (all when None)."""
        idx = list(range(len(work.prompts))) if subset is None else subset
        if tuple(idx) not in work.plans:  # one plan per update and subset of rows
            runs = plan([work.prompts[i] for i in idx], [work.completions[i] for i in idx],
                        max_rows=self.spec.micro_batch, max_tokens=self.spec.micro_batch_tokens,
                        shares_prefix=not self.spec.gradient_checkpointing,
                        model=self.policy.model)
            work.plans[tuple(idx)] = [[idx[j] for j in run] for run in runs]
        return work.plans[tuple(idx)]

    def forward(self, work: Work, part: list[int], *, grad: bool,
                entropy: bool | None = None, model: Any = None
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(logprobs, mask, entropy or None) of the rows ``part``."""
        model = self.policy.model if model is None else model
        want = self.spec.entropy_coef > 0 if entropy is None else entropy
        args = (model, [work.prompts[i] for i in part], [work.completions[i] for i in part],
                self.spec.temperature, self.policy.tokenizer.pad_token_id)
        with torch.set_grad_enabled(grad), autocast(self.spec.precision, self.device()):
            if want:
                return sequence_logprobs_entropy(*args, entropy=token_entropy)
            return (*sequence_logprobs(*args), None)

    def teacher_forced(self, prompts: list[list[int]], completions: list[list[int]],
                       temperature: float) -> list[list[float]]:
        """Teacher-forced ``log_softmax(logits / T)`` of each completion token at the
        current weights (gfcr.core.services.Learner.logprobs)."""
        work = Work(prompts=prompts, completions=completions)
        out: list[list[float]] = [[] for _ in prompts]
        rows = [i for i, c in enumerate(completions) if c]
        with torch.set_grad_enabled(False):
            for part in self.micro_batches(work, rows) if rows else []:
                args = (self.policy.model, [prompts[i] for i in part],
                        [completions[i] for i in part], temperature,
                        self.policy.tokenizer.pad_token_id)
                lp, _ = sequence_logprobs(*args)
                for j, i in enumerate(part):
                    out[i] = lp[j, :len(completions[i])].float().cpu().tolist()
        return out

    def no_grad(self, prompts: list[list[int]], completions: list[list[int]],
                rows: list[int], entropy: bool
                ) -> tuple[dict[int, np.ndarray], list[np.ndarray]]:
        """Proximal logprobs (current weights, before the update) of ``rows`` and, when
        ``entropy``, every row's token entropies."""
        work = Work(prompts=prompts, completions=completions)
        prox: dict[int, np.ndarray] = {}
        ent: list[np.ndarray] = [np.zeros(len(c)) for c in completions]
        for part in self.micro_batches(work, rows) if rows else []:
            lp, _, h = self.forward(work, part, grad=False, entropy=entropy)
            for j, i in enumerate(part):
                n = len(completions[i])
                prox[i] = lp[j, :n].float().cpu().numpy()
                if h is not None:
                    ent[i] = h[j, :n].float().cpu().numpy()
        return prox, ent

    def reference(self, work: Work, reference: torch.nn.Module | None,
                  lora: LoraTraining | None) -> list[np.ndarray]:
        """Logprobs of every row under the frozen ``reference``; with an active ``lora``
        the base itself, the adapter switched off."""
        out: list[np.ndarray] = [np.zeros(0)] * len(work.prompts)
        for part in self.micro_batches(work):
            with lora.reference() if lora is not None else contextlib.nullcontext():
                lp, _, _ = self.forward(work, part, grad=False, entropy=False,
                                        model=None if lora else reference)
            for j, i in enumerate(part):
                out[i] = lp[j, :len(work.completions[i])].float().cpu().numpy()
        return out
