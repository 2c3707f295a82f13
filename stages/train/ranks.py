"""How one update's rows are shared between the learner's processes.

The GRPO learner (stages.train.learner) computes everything that normalises the loss over
the *whole* batch on every process: the group advantages, the rows with signal, their
masks, and the counts the loss is divided by (loss tokens for ``token_mean``, rows for
``seq_mean``, the longest completion for ``seq_mean_token_sum_norm``). Only the forward
and backward passes of the gradient are shared out, by rows. Each process's micro-batch
losses are divided by the whole batch's counts, so the sum of every process's gradient is
the one-process gradient: the sharded learner (stages.train.fsdp) sums the gradients over
processes (FSDP2 would average them) and the loss means exactly what it means in one
process. A process left with fewer micro-batches than another runs empty ones (a forward
and a backward of zero loss), because FSDP2 gathers and reduces in every forward and
backward, and every process must take part in each.

In one process (:class:`OneProcess`) this is the identity.
"""

from __future__ import annotations

import copy
from typing import Any, Callable, Protocol, runtime_checkable

import torch

Pack = Callable[[list[int]], list[list[int]]]
"""``pack(rows) -> micro-batches`` of those rows (stages.train.batching.pack)."""


class Ranks(Protocol):
    """The learner's processes as an update sees them."""

    def parts(self, rows: list[int], lengths: list[int], pack: Pack
              ) -> list[list[int] | None]:
        """This process's micro-batches of ``rows`` (``lengths`` their token counts);
        None: an empty micro-batch, run so every process runs as many."""
        ...

    def total(self, values: dict[str, float]) -> dict[str, float]:
        """Each value summed over the processes."""
        ...

    def frozen_copy(self, model: torch.nn.Module) -> torch.nn.Module:
        """A copy of ``model`` that no update changes and no gradient reaches (the KL
        reference)."""
        ...


class OneProcess:
    """The learner alone in its process: every row, nothing to sum."""

    def parts(self, rows: list[int], lengths: list[int], pack: Pack
              ) -> list[list[int] | None]:
        return list(pack(rows))

    def total(self, values: dict[str, float]) -> dict[str, float]:
        return dict(values)

    def frozen_copy(self, model: torch.nn.Module) -> torch.nn.Module:
        ref = copy.deepcopy(model)
        ref.eval()
        for p in ref.parameters():
            p.requires_grad_(False)
        return ref


def split(rows: list[int], lengths: list[int], world: int) -> list[list[int]]:
    """``rows`` dealt to ``world`` processes by tokens: longest first, each to the process
    with the fewest tokens so far (ties: the lower rank), each share then in batch order
    (a group's rows stay adjacent for the shared-prefix forward). Deterministic, so every
    process computes every share without talking to the others.

    >>> split([0, 1, 2, 3], [5, 1, 4, 2], 2)
    [[0, 1], [2, 3]]
    """
    if len(rows) != len(lengths):
        raise ValueError(f"split: {len(rows)} rows but {len(lengths)} lengths")
    load = [0] * world
    shares: list[list[int]] = [[] for _ in range(world)]
    for j in sorted(range(len(rows)), key=lambda j: (-lengths[j], j)):
        rank = min(range(world), key=lambda r: (load[r], r))
        load[rank] += lengths[j]
        shares[rank].append(j)
    return [[rows[j] for j in sorted(share)] for share in shares]


def padded_parts(rows: list[int], lengths: list[int], pack: Pack, rank: int,
                 world: int) -> list[list[int] | None]:
    """``rank``'s micro-batches of its :func:`split` share, padded with None to the
    largest count any process has."""
    by_row = dict(zip(rows, lengths))
    packed = [pack(share) for share in split(rows, [by_row[r] for r in rows], world)]
    most = max((len(p) for p in packed), default=0)
    mine: list[list[int] | None] = list(packed[rank])
    return mine + [None] * (most - len(mine))


@runtime_checkable
class Shardable(Protocol):
    """A stage's learner that a sharded learner can drive (the GRPO learner): its
    processes, optimizer, update count, KL reference and device are its attributes."""

    ranks: Ranks
    optimizer: torch.optim.Optimizer
    updates: int
    reference: torch.nn.Module | None
    device: torch.device

    def update(self, ctx: Any, batch: Any) -> Any: ...

    def logprobs(self, prompts: list[list[int]], completions: list[list[int]],
                 temperature: float) -> list[list[float]]: ...
