"""Micro-batches for gradient accumulation, packed under a sequence count and a token budget.

A micro-batch costs memory in proportion to its padded rectangle: rows times the longest
``prompt + completion`` in it. :func:`pack` cuts the batch, in order, into runs whose
rectangle stays within ``max_tokens`` and whose row count stays within ``max_rows``.
Order is kept (not sorted by length) so the rows of a GRPO group, which share their
prompt, stay together for the shared-prefix forward (:mod:`stages.train.forward`).
A single sequence longer than the budget gets a micro-batch of its own: a sequence is
never split.

The gradient of the whole batch is the sum of the micro-batch gradients as long as each
micro-batch's loss is divided by the whole batch's count (``denominator`` in
:func:`stages.train.loss.policy_loss`), which the learner does.

>>> pack([3, 3, 5, 2], max_rows=8, max_tokens=9)
[[0, 1], [2], [3]]
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch


def pack(lengths: Sequence[int], *, max_rows: int, max_tokens: int | None = None
         ) -> list[list[int]]:
    """Consecutive runs of row indices: each has at most ``max_rows`` rows and, when
    ``max_tokens`` is set, ``len(run) * max(lengths in run) <= max_tokens`` (a row longer
    than ``max_tokens`` alone excepted)."""
    if max_rows < 1:
        raise ValueError(f"pack: max_rows must be >= 1, got {max_rows!r}")
    if max_tokens is not None and max_tokens < 1:
        raise ValueError(f"pack: max_tokens must be >= 1, got {max_tokens!r}")
    runs: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for i, n in enumerate(lengths):
        wider = max(longest, int(n))
        fits = len(current) < max_rows and (
            max_tokens is None or (len(current) + 1) * wider <= max_tokens)
        if current and not fits:
            runs.append(current)
            current, wider = [], int(n)
        current.append(i)
        longest = wider
    if current:
        runs.append(current)
    return runs


def padded(rows: Sequence[np.ndarray | Sequence[float]], width: int, *, fill: float = 0.0,
           dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"
           ) -> torch.Tensor:
    """``[len(rows), width]`` tensor of ``rows`` right-padded with ``fill``."""
    out = torch.full((len(rows), width), fill, dtype=dtype)
    for i, r in enumerate(rows):
        if len(r):
            out[i, :len(r)] = torch.as_tensor(np.asarray(r), dtype=dtype)
    return out.to(device)


def padded_rows(values: list[np.ndarray] | None, part: list[int], width: int,
                device: torch.device) -> torch.Tensor | None:
    """:func:`padded` of the rows ``part`` of ``values``; None when ``values`` is None."""
    return None if values is None else padded([values[i] for i in part], width, device=device)
