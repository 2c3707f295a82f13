"""Optimiser-side helpers of the learner: the learning-rate schedule and bf16 autocast.

The schedule is a pure function of the update's position (the pipeline step), so a
resumed learner needs no scheduler state beyond that position: the learning rate of step
``s`` is ``lr * lr_factor(s, ...)`` in any process.

>>> [round(lr_factor(s, "cosine", warmup=2, total=6), 3) for s in range(6)]
[0.5, 1.0, 1.0, 0.854, 0.5, 0.146]
"""

from __future__ import annotations

import contextlib
import math
from typing import Literal

import torch

Schedule = Literal["constant", "cosine", "linear"]
Precision = Literal["fp32", "bf16"]


def lr_factor(step: int, schedule: Schedule, *, warmup: int = 0,
              total: int | None = None) -> float:
    """Multiplier of the base learning rate at ``step`` (0-based).

    Linear warm-up over the first ``warmup`` steps (``(step + 1) / warmup``), then
    ``constant`` (1), ``linear`` decay or ``cosine`` decay (Loshchilov & Hutter 2017,
    SGDR, without restarts) from 1 towards 0 at ``total`` steps; steps past ``total``
    stay at the end value. ``total`` is needed by the decaying schedules.
    """
    if step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    if total is None:
        raise ValueError(f"lr_factor: schedule {schedule!r} needs the total step count")
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    if schedule == "linear":
        return 1.0 - progress
    if schedule == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    raise ValueError(f"lr_factor: unknown schedule {schedule!r}; known: constant, cosine, "
                     "linear")


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def autocast(precision: Precision, device: torch.device) -> contextlib.AbstractContextManager:
    """The forward-pass context for ``precision``: nothing for fp32, bf16 autocast (weights
    and optimizer state stay fp32, as in mixed-precision training, Micikevicius et al.
    2018) for bf16. Logprobs and entropies are computed in fp32 from the bf16 logits."""
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


def bf16_problem(device: torch.device) -> str | None:
    """Why bf16 autocast cannot run on ``device``, or None when it can."""
    if device.type == "cuda" and not torch.cuda.is_bf16_supported():
        return f"CUDA device {torch.cuda.get_device_name(device)!r} does not support bf16"
    if device.type not in ("cpu", "cuda", "xpu", "mps"):
        return f"no bf16 autocast on device type {device.type!r}"
    return None
