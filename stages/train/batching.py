"""Micro-batches for gradient accumulation, packed under a sequence count and a token budget.

A micro-batch costs memory in proportion to its padded rectangle: rows times the longest
``prompt + completion`` in it. :func:`pack` cuts a sequence of rows, in order, into runs
whose rectangle stays within ``max_tokens`` and whose row count stays within
``max_rows``. A single sequence longer than the budget gets a micro-batch of its own: a
sequence is never split.

The learner's micro-batches are :func:`plan`'s: rows ordered and cut so that the forward
passes run the fewest token slots (:func:`slots`) plus a fixed cost per micro-batch. A
GRPO group's rows share their prompt, and the shared-prefix forward
(:mod:`stages.logprobs`) runs a common prefix once, so keeping a group together saves its
prompt; sorting rows by length saves padding (the length bucketing of Megatron and TRL's
padding-free batches). The plan weighs the two: within a group the rows go longest first
and the group is split where the padding saved is worth another run of its prompt, or
the rows are sorted across groups, whichever costs less. Given the model, a micro-batch
costs what its forward will run (:func:`stages.logprobs.route`): packed
(:mod:`stages.packing`: every token once, a group's prompt shared, attention over the
packed row's square) or padded (the rectangle after a shared prefix), whichever is
cheaper. ``packing_waste`` (:func:`waste`) is the padded share of the token slots the
chosen plan runs: none in a packed micro-batch.

The gradient of the whole batch is the sum of the micro-batch gradients as long as each
micro-batch's loss is divided by the whole batch's count (``denominator`` in
:func:`stages.train.loss.policy_loss`), which the learner does.

>>> pack([3, 3, 5, 2], max_rows=8, max_tokens=9)
[[0, 1], [2], [3]]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

from stages import packing
from stages.logprobs import MIN_SHARED, common_prefix, padded_prefix, route


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


MAX_WASTE = 0.05
"""The padded share of the micro-batch rectangles a plan may leave (issue 33's target)."""
SLACK = 0.1
"""How much more a plan within MAX_WASTE may cost than the cheapest and still be chosen."""
OVERHEAD = {"cpu": 16, "cuda": 1024}
"""The fixed cost of one more micro-batch (a forward and a backward: kernel launches,
Python), in token slots, by device type (others: the CPU's); a GPU wants few, big ones."""


def plan(prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]], *,
         max_rows: int, max_tokens: int | None = None, shares_prefix: bool = True,
         overhead: int | None = None, model: Any = None) -> list[list[int]]:
    """Micro-batches (row indices) of the rows at the least cost: token :func:`slots`
    plus ``overhead`` a micro-batch, each within ``max_rows`` rows and ``max_tokens`` (a
    padded rectangle's slots, a packed row's tokens). Two orders are cut optimally
    (:func:`_cuts`): the batch's groups in turn, each group's rows longest first (a group
    split in two runs its prompt twice: worth it when that saves more padding), and every
    row by length, longest first. The cheaper is kept, unless the other costs at most
    :data:`SLACK` more and leaves at most :data:`MAX_WASTE` padding where the cheaper
    leaves more: padding holds memory too, and slot counts do not see every cost (a few
    short prompts saved against a batch of padded rows is a wash). ``shares_prefix``:
    whether the forward runs a common prompt prefix once (off under gradient
    checkpointing). ``model``: the model the forward runs; given, each micro-batch costs
    what the path :func:`stages.logprobs.route` takes for it does, packed
    (:mod:`stages.packing`) or padded, attention included; None: padded, slots only.
    ``overhead`` None: :data:`OVERHEAD` of the model's device type (the CPU's without)."""
    lengths = [len(p) + len(c) for p, c in zip(prompts, completions)]
    first: dict[tuple[int, ...], int] = {}
    keys = [first.setdefault(tuple(p), i) for i, p in enumerate(prompts)]
    grouped = sorted(range(len(lengths)), key=lambda i: (keys[i], -lengths[i], i))
    by_length = sorted(range(len(lengths)), key=lambda i: (-lengths[i], keys[i], i))
    model_cost = _Model.of(model, shares_prefix)
    if overhead is None:
        kind = next(model.parameters()).device.type if model is not None else "cpu"
        overhead = OVERHEAD.get(kind, OVERHEAD["cpu"])
    options = sorted(_cuts(order, prompts, completions, max_rows, max_tokens, model_cost,
                           overhead) for order in (grouped, by_length))
    tight = [runs for cost, runs in options if cost <= options[0][0] * (1 + SLACK)
             and waste(prompts, completions, runs, model=model) <= MAX_WASTE]
    return tight[0] if tight else options[0][1]


@dataclass(frozen=True)
class _Model:
    """What the cost of a micro-batch depends on: the packed path (None: not taken), the
    attention's :func:`stages.packing.pair_cost`, a sliding window and prefix sharing."""
    how: packing.Mode | None
    pairs: float
    window: float
    shares_prefix: bool

    @classmethod
    def of(cls, model: Any, shares_prefix: bool) -> _Model:
        if model is None:
            return cls(None, 0.0, np.inf, shares_prefix)
        prefix = shares_prefix and not bool(getattr(model, "is_gradient_checkpointing", False))
        size = packing.window(model)
        return cls(None if route_blocked(model) else packing.mode(model),
                   packing.pair_cost(model), np.inf if size is None else size, prefix)


def route_blocked(model: Any) -> bool:
    """Whether packing is off for ``model`` whatever the rows (a sharded model)."""
    return route(model, [[0]], [[]]) is None


def _cuts(order: list[int], prompts: Sequence[Sequence[int]],
          completions: Sequence[Sequence[int]], max_rows: int, max_tokens: int | None,
          model: _Model, overhead: int) -> tuple[int, list[list[int]]]:
    """``(cost, runs)``: the cheapest cut of ``order`` into consecutive micro-batches
    (dynamic programming over the last cut, each end's candidates at once in numpy; a
    row longer than the budget goes alone; ties: the shorter last micro-batch)."""
    if max_rows < 1:
        raise ValueError(f"plan: max_rows must be >= 1, got {max_rows!r}")
    n = len(order)
    seqs = [list(prompts[i]) + list(completions[i]) for i in order]
    total = np.asarray([len(s) for s in seqs], dtype=np.int64)
    prompt = np.asarray([len(prompts[i]) for i in order], dtype=np.int64)
    shared = np.asarray([0] + [_lcp(prompts[order[j - 1]], prompts[order[j]])
                               for j in range(1, n)], dtype=np.int64)
    tree = model.how == "tree"
    packed_share = np.cumsum([0] + [packing.shared(seqs[j - 1], seqs[j]) if tree and j else 0
                                    for j in range(n)])
    sums, squares = np.cumsum(np.r_[0, total]), np.cumsum(np.r_[0, total * total])
    best, back = np.zeros(n + 1), np.zeros(n + 1, dtype=np.int64)
    for end in range(1, n + 1):
        lo = max(end - max_rows, 0)
        starts = np.arange(lo, end)
        rows = end - starts
        longest = np.maximum.accumulate(total[lo:end][::-1])[::-1]
        # the prefix rows start..end-1 share: the least lcp of neighbours, below each prompt
        k = np.full(end - lo, 1 << 30, dtype=np.int64)
        k[:-1] = np.minimum.accumulate(shared[lo + 1:end][::-1])[::-1]
        prefix = np.minimum(k, np.minimum.accumulate(prompt[lo:end][::-1])[::-1] - 1)
        prefix = np.where((prefix >= MIN_SHARED) & (rows > 1) & model.shares_prefix, prefix, 0)
        width = longest - prefix
        padded = prefix + rows * width + model.pairs * (prefix * prefix
                                                        + rows * width * (prefix + width))
        size = rows * longest
        cost = padded
        if model.how is not None:
            tokens = sums[end] - sums[starts] - (packed_share[end] - packed_share[starts + 1])
            attn = tokens * tokens if tree else squares[end] - squares[starts]
            packed = tokens + model.pairs * attn
            packs = (packed <= padded) & (longest <= model.window)
            cost, size = np.where(packs, packed, padded), np.where(packs, tokens, size)
        cost = best[lo:end] + overhead + cost
        if max_tokens is not None:
            cost = np.where((rows > 1) & (size > max_tokens), np.inf, cost)
        pick = len(cost) - 1 - int(np.argmin(cost[::-1]))
        best[end], back[end] = cost[pick], lo + pick
    runs, end = [], n
    while end > 0:
        runs.append(order[int(back[end]):end])
        end = int(back[end])
    return int(best[n]), runs[::-1]


def _lcp(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the common prefix of two prompts."""
    n = min(len(a), len(b))
    j = 0
    while j < n and a[j] == b[j]:
        j += 1
    return j


def slots(prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]],
          run: Sequence[int], shares_prefix: bool = True, model: Any = None
          ) -> tuple[int, int]:
    """``(slots, real)`` of one micro-batch's forward: the positions it runs and how many
    of them hold a token. Padded: a shared prefix once, then rows x the longest rest;
    packed (``model`` given and :func:`stages.logprobs.route` packing these rows): its
    tokens, all real."""
    ps, cs = [prompts[i] for i in run], [completions[i] for i in run]
    chosen = route(model, ps, cs) if model is not None and run else None
    if chosen is not None and chosen.packs:
        return chosen.tokens, chosen.tokens
    if model is not None:
        k = padded_prefix(model, ps)
    else:
        k = common_prefix(ps) if shares_prefix and len(run) > 1 else 0
        k = k if k >= MIN_SHARED else 0
    rest = [len(p) + len(c) - k for p, c in zip(ps, cs)]
    return k + len(run) * max(rest, default=0), k + sum(rest)


def waste(prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]],
          runs: Sequence[Sequence[int]], *, model: Any = None) -> float:
    """``packing_waste``: the padded share of the token slots the micro-batches run.
    ``model`` given: the slots of the path each takes for it (:func:`slots`: a packed
    micro-batch holds none; a padded one's shared prefix is counted once). None: the
    rectangles (rows x the longest ``prompt + completion`` in each), the measure a plain
    padded loop has too."""
    if model is not None:
        pairs = [slots(prompts, completions, run, model=model) for run in runs if run]
        total, real = sum(s for s, _ in pairs), sum(r for _, r in pairs)
        return (total - real) / total if total else 0.0
    lengths = [len(p) + len(c) for p, c in zip(prompts, completions)]
    total = sum(len(run) * max(lengths[i] for i in run) for run in runs if run)
    real = sum(lengths[i] for run in runs for i in run)
    return (total - real) / total if total else 0.0


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
