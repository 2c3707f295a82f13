"""Micro-batches for gradient accumulation, packed under a sequence count and a token budget.

A micro-batch costs memory in proportion to its padded rectangle: rows times the longest
``prompt + completion`` in it. :func:`pack` cuts a sequence of rows, in order, into runs
whose rectangle stays within ``max_tokens`` and whose row count stays within
``max_rows``. A single sequence longer than the budget gets a micro-batch of its own: a
sequence is never split.

Which order to cut is :func:`plan`'s choice, by the token slots the forward passes will
run (:func:`slots`): the batch's own order keeps the rows of a GRPO group, which share
their prompt, together, so the shared-prefix forward (:mod:`stages.logprobs`) runs each
prompt once; the rows sorted by length leave almost no padding (the length bucketing of
Megatron and TRL's padding-free batches), at the price of running each row's prompt.
Whichever runs fewer slots wins, so long shared prompts keep their groups and varied
completion lengths get sorted. ``packing_waste`` (:func:`waste`) is the padded share of
the slots the chosen plan runs.

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

from stages.logprobs import MIN_SHARED, common_prefix


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


def plan(prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]], *,
         max_rows: int, max_tokens: int | None = None, shares_prefix: bool = True
         ) -> list[list[int]]:
    """Micro-batches (row indices) of the rows: the batch's order or the rows sorted by
    length (longest first), whichever runs fewer token :func:`slots`; ties keep the
    batch's order. ``shares_prefix``: whether the forward runs a common prompt prefix
    once (off under gradient checkpointing, stages.logprobs)."""
    lengths = [len(p) + len(c) for p, c in zip(prompts, completions)]
    kept = pack(lengths, max_rows=max_rows, max_tokens=max_tokens)
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], tuple(prompts[i]), i))
    by_length = [[order[j] for j in run] for run in
                 pack([lengths[i] for i in order], max_rows=max_rows, max_tokens=max_tokens)]
    cost = [sum(slots(prompts, completions, run, shares_prefix)[0] for run in runs)
            for runs in (kept, by_length)]
    return by_length if cost[1] < cost[0] else kept


def slots(prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]],
          run: Sequence[int], shares_prefix: bool = True) -> tuple[int, int]:
    """``(slots, real)`` of one micro-batch's forward: the positions it runs (a shared
    prefix once, then rows x the longest rest) and how many of them hold a token."""
    k = common_prefix([prompts[i] for i in run]) if shares_prefix and len(run) > 1 else 0
    k = k if k >= MIN_SHARED else 0
    rest = [len(prompts[i]) + len(completions[i]) - k for i in run]
    return k + len(run) * max(rest, default=0), k + sum(rest)


def waste(prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]],
          runs: Sequence[Sequence[int]], shares_prefix: bool = True) -> float:
    """``packing_waste``: padded slots over all slots of the micro-batches ``runs``."""
    counts = [slots(prompts, completions, run, shares_prefix) for run in runs]
    total = sum(c[0] for c in counts)
    return (total - sum(c[1] for c in counts)) / total if total else 0.0


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
