"""Supervised warm start on the task's reference answers, cached on disk.

A short behaviour-cloning stage before RL, as in DeepSeek-R1's cold start (DeepSeek-AI
2025) and most RL-for-reasoning recipes: a randomly initialised tiny policy samples no
correct answer at all, and GRPO needs some correct samples in a group to learn from.
The completion is ``answer + EOS``; the loss is the mean negative log-likelihood of the
completion tokens only (prompt tokens are context). With ``demonstrations`` (a
``module:function`` mapping a training row to a conversation) the examples are
multi-turn episodes instead: a tool call, the tool's output, the answer, with the
tool's tokens out of the loss (:mod:`stages.train.sft_demos`), so a policy learns to
emit well-formed tool calls before RL.

The trained weights are saved as safetensors under ``cache_dir``, keyed by a hash of the
model config, the tokenizer's vocabulary size, the task spec, this spec and the seed; a
second run with the same key loads them and skips training.

>>> SFT(steps=300, batch_size=64, lr=3e-3)  # doctest: +ELLIPSIS
SFT(type='sft', steps=300, batch_size=64, lr=0.003, ...)
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from pathlib import Path
from typing import Any, Callable, Literal

import torch
from pydantic import BaseModel, Field
from safetensors.torch import load_model, save_model

from gfcr.core.engine import encode_prompt
from gfcr.core.policy import Policy
from gfcr.core.stage import Spec
from gfcr.core.registry import register
from stages.train.device import adamw
from stages.train.forward import sequence_logprobs
from stages.train.sft_demos import Example, encode, resolve

_CACHE_VERSION = 1
"""Bump when the training procedure changes, so old cache files are not reused."""


@register("warmstart")
class SFT(Spec):
    """Supervised fine-tuning on (prompt, answer + EOS) pairs of the task's training split.

    AdamW (no weight decay), linear warm-up over the first ``warmup`` share of steps, then
    a constant ``lr`` or a cosine decay to 10% of it; gradient norm clipped at 1. Batches
    are drawn from shuffled passes over the prompts under the run seed, so a run is
    deterministic.
    """

    type: Literal["sft"] = "sft"
    steps: int = Field(1000, ge=1)
    """Optimizer steps."""
    batch_size: int = Field(64, ge=1)
    """(prompt, answer) examples per step."""
    lr: float = Field(3e-3, gt=0.0, le=1.0)
    """Peak learning rate (AdamW)."""
    warmup: float = Field(0.1, ge=0.0, lt=1.0)
    """Share of steps with a linear learning-rate warm-up."""
    schedule: Literal["constant", "cosine"] = "constant"
    """``constant`` leaves the learning rate high to the end (no annealing): the warm start
    is a noisier policy whose greedy accuracy RL can raise. ``cosine`` gives a stronger
    warm start (the embedded default uses it)."""
    demonstrations: str | None = None
    """``module:function`` mapping a training row (``prompt``, ``answer``, ``meta``,
    ``task``) to a :class:`stages.train.sft_demos.Demonstration`: train on whole
    episodes, tool turns masked (e.g. ``stages.envs.python_demos:python_call``); None:
    ``answer + EOS`` after the prompt."""

    def run(self, policy: Policy, task: Any, *, seed: int, cache_dir: Path,
            progress: Callable[[int, int], None] | None = None) -> dict[str, float]:
        """Train ``policy.model`` in place (or load the cached result); returns metrics.
        ``progress(done, total)`` is called after every training step."""
        started = time.perf_counter()
        path = Path(cache_dir) / f"sft-{self.cache_key(policy, task, seed)}.safetensors"
        if path.exists():
            load_model(policy.model, str(path))
            return {"cached": 1.0, "seconds": time.perf_counter() - started}
        loss = self._train(policy, task, seed, progress or (lambda done, total: None))
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        save_model(policy.model, str(partial))
        os.replace(partial, path)
        return {"cached": 0.0, "loss": loss, "steps": float(self.steps),
                "seconds": time.perf_counter() - started}

    def cache_key(self, policy: Policy, task: Any, seed: int) -> str:
        """sha256 (16 hex digits) of everything the trained weights depend on."""
        # a transformers model's config, when it has one (other models: their repr)
        # getattr: the model and tokenizer are foreign objects
        config = getattr(policy.model, "config", None)
        to_dict = getattr(config, "to_dict", None)  # (a transformers config has to_dict)
        parts = {
            "version": _CACHE_VERSION,
            "model": to_dict() if callable(to_dict) else repr(policy.model),
            # getattr: (a tokenizer may lack vocab_size)
            "vocab": getattr(policy.tokenizer, "vocab_size", None),
            "task": task.model_dump(mode="json") if isinstance(task, BaseModel) else repr(task),
            "sft": self._spec_key(),
            "seed": seed,
        }
        if hasattr(policy.tokenizer, "encode_prompt"):  # a chat template and system message
            parts["prompt_template"] = encode_prompt(policy.tokenizer, "{prompt}")
        canonical = json.dumps(parts, sort_keys=True, default=str, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]

    def _spec_key(self) -> dict[str, Any]:
        """This spec as the cache key holds it; without ``demonstrations`` when unset,
        so the keys of warm starts cached before that field existed stay valid."""
        dump = self.model_dump(mode="json")
        if dump.get("demonstrations") is None:
            dump.pop("demonstrations", None)
        return dump

    def _train(self, policy: Policy, task: Any, seed: int,
               progress: Callable[[int, int], None]) -> float:
        """The training loop; returns the mean loss over the last 10% of steps."""
        examples = _examples(policy, task, self.demonstrations)
        model = policy.model
        model.train()
        optimizer = adamw(list(model.parameters()), self.lr)  # fused on CUDA
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, self._lr_factor)
        order = _batches(len(examples), self.batch_size, self.steps, seed)
        tail: list[float] = []
        progress(0, self.steps)
        for step, idx in enumerate(order):
            batch = [examples[i] for i in idx]
            logprobs, mask = sequence_logprobs(model, [e.prompt for e in batch],
                                               [e.completion for e in batch], 1.0,
                                               policy.tokenizer.pad_token_id)
            mask = mask * _loss_mask(batch, mask.shape[1]).to(mask.device)
            loss = -(logprobs * mask).sum() / mask.sum()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            if step >= self.steps - max(1, self.steps // 10):
                tail.append(loss.item())
            progress(step + 1, self.steps)
        return sum(tail) / len(tail)

    def _lr_factor(self, step: int) -> float:
        warm = int(self.warmup * self.steps)
        if step < warm:
            return (step + 1) / warm
        if self.schedule == "constant":
            return 1.0
        progress = (step - warm) / max(1, self.steps - warm)
        return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress))


def _examples(policy: Policy, task: Any, demonstrations: str | None) -> list[Example]:
    """Per training row: the prompt ids (as the engine encodes them) and ``answer + EOS``
    ids, all in the loss; or, with ``demonstrations``, the row's demonstration episode."""
    table = task.train_prompts()
    tok = policy.tokenizer
    demo = resolve(demonstrations) if demonstrations else None
    columns = [c for c in ("prompt", "answer", "meta", "task") if c in table.column_names]
    examples = []
    for row in table.select(columns).to_pylist():
        if row["answer"] is None:
            raise ValueError(f"sft: training prompt {row['prompt']!r} has no reference answer")
        if demo is not None:
            examples.append(encode(tok, demo(row)))
            continue
        answer = tok.encode(row["answer"]) + [tok.eos_token_id]
        examples.append(Example(encode_prompt(tok, row["prompt"]), answer, [True] * len(answer)))
    if not examples:
        raise ValueError("sft: the task has no training prompts")
    return examples


def _loss_mask(batch: list[Example], width: int) -> torch.Tensor:
    """``[B, width]``: each example's completion mask, right-padded with False."""
    out = torch.zeros(len(batch), width)
    for i, e in enumerate(batch):
        out[i, :len(e.mask)] = torch.tensor(e.mask[:width], dtype=torch.float32)
    return out


def _batches(n: int, size: int, steps: int, seed: int) -> list[list[int]]:
    """``steps`` batches of indices from successive seeded permutations of range(n)."""
    gen = torch.Generator().manual_seed(seed)
    flat: list[int] = []
    while len(flat) < steps * size:
        flat.extend(torch.randperm(n, generator=gen).tolist())
    return [flat[i * size:(i + 1) * size] for i in range(steps)]
