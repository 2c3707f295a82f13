"""Packed micro-batches: a micro-batch's sequences laid end to end in one row, no padding.

A padded micro-batch runs ``rows x longest`` token slots; a packed one runs each token
once. The rows are laid out as a prefix tree in depth-first order: a sequence (prompt +
completion) that begins like the one before it shares those tokens with it, so a GRPO
group's prompt runs once and each completion after it (the shared-prefix forward of
"Prefix Grouper", 2025, without the padding of its batched suffixes). Each token's
``position_ids`` entry is its depth in the tree (its position in its own sequence), and
it attends to exactly its ancestors: in depth-first order those are the tokens ``k <= q``
whose subtree, a contiguous range ``[k, end[k])``, holds ``q``. So the attention mask is
built on the device from one integer per token (:func:`tree_mask`), no host sync.

Which attention takes such a mask (:func:`mode`): SDPA and eager take a 4-D mask as
given (transformers passes a 4-D ``attention_mask`` through untouched), so they run the
tree. Other kernels (flash attention) cannot take an arbitrary mask: they get the
sequences packed without sharing, ``position_ids`` restarting at 0 at each sequence and no
mask, from which transformers finds the sequence boundaries itself
(``transformers.masking_utils.find_packed_sequence_indices``). Sliding-window attention
ignores a custom mask, so a model with a window shorter than the longest sequence is not
packed.

What a path costs (:func:`costs`, the same model :mod:`stages.train.batching` plans
with): token slots, plus the attention's query-key pairs weighted by their share of a
token's compute (:func:`pair_cost`). A dense mask over a packed row of ``N`` tokens runs
``N x N`` pairs where padded rows run ``rows x width x (prefix + width)``; flash
attention on packed sequences runs each sequence's own square only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Sequence

import numpy as np
import torch

Mode = Literal["tree", "flat"]
TREE_ATTENTION = frozenset({"sdpa", "eager"})
"""Attention implementations that take a 4-D mask as given (the prefix tree's)."""


def mode(model: Any) -> Mode:
    """``"tree"`` where the model's attention takes a 4-D mask, ``"flat"`` otherwise."""
    config = getattr(model, "config", None)  # getattr: any module with the call convention
    impl = getattr(config, "_attn_implementation", None)
    return "tree" if impl in TREE_ATTENTION else "flat"


def pair_cost(model: Any) -> float:
    """One query-key pair's compute as a share of one token's through a layer:
    ``4 h`` (scores and weighted sum) over ``2 x (4 h^2 + 3 h i)`` (the projections and
    the MLP), i.e. ``2 / (4 h + 3 i)``; 1e-4 when the config does not say."""
    config = getattr(model, "config", None)
    hidden = getattr(config, "hidden_size", None)
    inner = getattr(config, "intermediate_size", None)
    if not isinstance(hidden, int) or not isinstance(inner, int):
        return 1e-4
    return 2.0 / (4 * hidden + 3 * inner)


def window(model: Any) -> int | None:
    """The model's sliding attention window (None: none); a custom mask ignores it."""
    config = getattr(model, "config", None)
    size = getattr(config, "sliding_window", None)
    used = getattr(config, "use_sliding_window", True)
    return size if used and isinstance(size, int) else None


def window_allows(model: Any, longest: int) -> bool:
    """Whether a custom mask keeps the model's attention exact: no sliding window, or one
    at least as long as the longest sequence."""
    size = window(model)
    return size is None or size >= longest


def shared(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the common prefix of two sequences."""
    n = min(len(a), len(b))
    j = 0
    while j < n and a[j] == b[j]:
        j += 1
    return j


def sequences(prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]]
              ) -> list[list[int]]:
    """Prompt + completion of each row."""
    return [list(p) + list(c) for p, c in zip(prompts, completions)]


def tree_slots(seqs: Sequence[Sequence[int]], share: bool = True) -> int:
    """Tokens of the packed row: every sequence's, less (when ``share``) what each shares
    with the one before it in sorted order (the prefix tree's size)."""
    total = sum(len(s) for s in seqs)
    if share:
        ordered = sorted(list(s) for s in seqs)
        total -= sum(shared(ordered[j - 1], ordered[j]) for j in range(1, len(ordered)))
    return total


@dataclass(frozen=True)
class Costs:
    """One micro-batch's two ways: packed (``packed`` cost, ``tokens`` slots, all real)
    or padded (``padded`` cost, ``slots`` of which ``real`` hold a token)."""
    packed: float
    tokens: int
    padded: float
    slots: int
    real: int

    @property
    def packs(self) -> bool:
        """Whether the packed path is the cheaper (ties: packed, it holds no padding)."""
        return self.packed <= self.padded


def costs(prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]], *,
          how: Mode, pairs: float, prefix: int) -> Costs:
    """:class:`Costs` of one micro-batch: ``prefix`` is the common prefix the padded path
    runs once (0: none), ``pairs`` the :func:`pair_cost`."""
    seqs = sequences(prompts, completions)
    lengths = [len(s) for s in seqs]
    if how == "tree":
        tokens = tree_slots(seqs)
        packed = tokens + pairs * tokens * tokens
    else:
        tokens = sum(lengths)
        packed = tokens + pairs * sum(n * n for n in lengths)
    width = max(lengths, default=0) - prefix
    slots = prefix + len(seqs) * width
    padded = slots + pairs * (prefix * prefix + len(seqs) * width * (prefix + width))
    return Costs(packed, tokens, padded, slots, prefix + sum(n - prefix for n in lengths))


@dataclass(frozen=True)
class Layout:
    """A packed row: ``ids``, ``positions`` (depth) and ``ends`` (subtree end) per token,
    and per row the packed index of the output predicting each completion token."""
    ids: list[int]
    positions: list[int]
    ends: list[int]
    where: list[list[int]]


def layout(prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]],
           share: bool = True) -> Layout:
    """The rows as a prefix tree in depth-first order: sorted, each shares with the row
    before it (without ``share``, sequences end to end in the given order); every prompt
    needs a token. ``where`` is in the rows' given order."""
    ids: list[int] = []
    depth: list[int] = []
    path: list[int] = []  # packed index of each token of the row before
    starts: list[int] = []
    where: dict[int, list[int]] = {}
    given = sequences(prompts, completions)
    order = sorted(range(len(given)), key=given.__getitem__) if share else range(len(given))
    seqs = [given[i] for i in order]
    for j, (i, seq) in enumerate(zip(order, seqs)):
        keep = shared(seqs[j - 1], seq) if share and j else 0
        starts.append(len(ids))
        path = path[:keep] + list(range(len(ids), len(ids) + len(seq) - keep))
        ids.extend(seq[keep:])
        depth.extend(range(keep, len(seq)))
        where[i] = path[len(prompts[i]) - 1:len(seq) - 1]
    return Layout(ids, depth, _ends(seqs, starts, len(ids), share),
                  [where[i] for i in range(len(given))])


def _ends(seqs: list[list[int]], starts: list[int], total: int, share: bool) -> list[int]:
    """Each token's subtree end: the start of the first later row that does not share it
    (shares no deeper than the token's depth)."""
    keeps = np.asarray([0] + [shared(seqs[j - 1], seqs[j]) if share else 0
                              for j in range(1, len(seqs))], dtype=np.int64)
    bounds = np.asarray(starts[1:] + [total], dtype=np.int64)
    ends: list[int] = []
    for j, seq in enumerate(seqs):
        depths = np.arange(int(keeps[j]), len(seq))
        # the least share of rows j+1.. so far, non-increasing: the first <= depth ends it
        low = np.minimum.accumulate(keeps[j + 1:]) if j + 1 < len(seqs) else keeps[:0]
        first = np.searchsorted(-low, -depths, side="left")
        ends.extend(bounds[j + first].tolist())
    return ends


def tree_mask(ends: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    """``[1, 1, N, N]`` mask of the tree: query ``q`` sees key ``k`` when ``k <= q <
    ends[k]``. Boolean (True: attend) for SDPA; additive in ``dtype`` for eager."""
    at = torch.arange(len(ends), device=ends.device)
    seen = (at[None, :] <= at[:, None]) & (at[:, None] < ends[None, :])
    if dtype is None:
        return seen[None, None]
    blocked = torch.zeros(seen.shape, dtype=dtype, device=ends.device)
    return blocked.masked_fill(~seen, torch.finfo(dtype).min)[None, None]


def packed_forward(model: Any, prompts: Sequence[Sequence[int]],
                   completions: Sequence[Sequence[int]], how: Mode
                   ) -> tuple[Any, torch.Tensor]:
    """``(output, where)``: one forward over the packed row ``[1, N]`` and, per
    completion token, the index into the row's N outputs that predicts it ``[B, T]``
    (padding positions: 0). Index tensors are built on the host: no sync."""
    device = next(model.parameters()).device
    row = layout(prompts, completions, share=how == "tree")
    ids = torch.tensor([row.ids], device=device)
    positions = torch.tensor([row.positions], device=device)
    if how == "tree":
        impl = getattr(model.config, "_attn_implementation", None)
        dtype = None if impl == "sdpa" else model.get_input_embeddings().weight.dtype
        mask = tree_mask(torch.tensor(row.ends, device=device), dtype)
        out = model(input_ids=ids, position_ids=positions, attention_mask=mask,
                    use_cache=False)
    else:  # transformers finds the sequences from the positions, without a cache only
        out = model(input_ids=ids, position_ids=positions, use_cache=False)
    n_out = max((len(c) for c in completions), default=0)
    where = torch.zeros((len(prompts), n_out), dtype=torch.long)
    for i, w in enumerate(row.where):
        where[i, :len(w)] = torch.tensor(w, dtype=torch.long)
    return out, where.to(device)
