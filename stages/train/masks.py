"""Loss masks the trainer honours: which completion tokens the policy gradient sees.

Two upstream stages ask the trainer to leave tokens out of the loss, each through an
extra column, and only when that column is in the batch:

- a row's ``turns`` (:data:`gfcr.rollout.TURN_TYPE`): each assistant turn's ``mask``;
  tokens of turns without one (an environment's or a tool's) are out of the loss
  (:func:`gfcr.rollout.loss_mask`). A forced-prefix turn (a hint) is masked out; for a
  single-turn row the turns are derived from ``hint_tokens`` (:func:`gfcr.rollout.conform`),
  so both say the same. Rows without turns fall back on ``hint_tokens``:
- ``hint_tokens`` (int32, :data:`gfcr.rollout.HINT_TOKENS`, ADHint): the first
  ``hint_tokens`` tokens of ``completion_ids`` were forced from the reference answer, not
  sampled by the policy. They stay in the sequence (the policy's later tokens are
  conditioned on them) but are masked out of the loss, so neither their gradient nor
  their ratio counts (:func:`hint_masks`).
- ``token_keep_ratio`` (float64, :data:`gfcr.rollout.TOKEN_KEEP_RATIO`, D³S): keep only that share of
  the batch's loss tokens, those with the largest ``|A_i| * H_{i,t}``, where ``H`` is the
  policy's next-token entropy at the training temperature from the trainer's own forward
  pass (:func:`selected_masks`, which applies a token selector of :mod:`stages.train.selection`).

D³S also hands the trainer its advantages: ``d3s_advantage`` (float64, null = none) is
each row's advantage within its whole group, the values D³S chose the subset on. Where it
is present the learner trains the row on it, ranks the row's tokens by it (``|A|``) and
reports it as the row's ``advantage``, with no renormalisation
(:func:`override_advantages`): recomputed over the kept subset, a std-normalised estimator
would give every subset unit variance and undo the max-Var(A) choice.

Departure from D³S: the share is of the tokens of rows the learner trains on (rows with a
non-zero advantage and at least one loss token), not of every completion token in the
batch; rows without signal carry no gradient whatever their mask.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pyarrow as pa

from gfcr.rollout import D3S_ADVANTAGE, HINT_TOKENS, TOKEN_KEEP_RATIO, col, loss_mask
from stages.train.selection import TOKEN_SELECTORS, d3s_tokens


def hint_masks(batch: pa.Table, rows: Sequence[int], lengths: Sequence[int],
               *, stage: str = "grpo") -> list[np.ndarray]:
    """Per selected row, a bool mask over its completion: its turns' loss mask where it has
    turns; else False on the leading ``hint_tokens`` forced tokens, True elsewhere (all
    True without the column)."""
    turns = batch.column(col.TURNS) if col.TURNS in batch.column_names else None
    hints = (batch.column(HINT_TOKENS).to_pylist() if HINT_TOKENS in batch.column_names
             else [0] * batch.num_rows)
    out = []
    for i, n in zip(rows, lengths):
        trajectory = None if turns is None else turns[int(i)].as_py()
        if trajectory is not None:
            out.append(_turn_mask(trajectory, n, int(i), stage))
            continue
        h = hints[i] or 0
        if h < 0 or h > n:
            raise ValueError(f"{stage}: batch row {int(i)!r} has {HINT_TOKENS}={h!r} but "
                             f"{n!r} completion tokens")
        mask = np.ones(n, bool)
        mask[:h] = False
        out.append(mask)
    return out


def _turn_mask(turns: list[dict], n: int, row: int, stage: str) -> np.ndarray:
    mask = np.asarray(loss_mask(turns), bool)
    if len(mask) != n:
        raise ValueError(f"{stage}: batch row {row!r} has {len(mask)} completion tokens in "
                         f"its turns but {n!r} in completion_ids")
    return mask


def keep_ratio(batch: pa.Table, *, stage: str = "grpo") -> float | None:
    """The batch's D³S token share, or None (keep every token) without the column or
    with every value null. D³S writes one value per step; rows replayed from an earlier
    step may carry that step's smaller share (the schedule relaxes towards 1), so the
    largest, the current step's, is used."""
    if TOKEN_KEEP_RATIO not in batch.column_names:
        return None
    values = [v for v in batch.column(TOKEN_KEEP_RATIO).to_pylist() if v is not None]
    if not values:
        return None
    ratio = max(values)
    if not 0.0 < ratio <= 1.0:
        raise ValueError(f"{stage}: column {TOKEN_KEEP_RATIO!r} must lie in (0, 1], "
                         f"got {ratio!r}")
    return ratio


def override_advantages(batch: pa.Table, adv: np.ndarray, *, stage: str = "grpo") -> np.ndarray:
    """``adv`` with each row's ``d3s_advantage`` in its place where that is not null;
    ``adv`` itself without the column. The values are used as they are (no
    renormalisation), so the update sees the whole-group advantages D³S chose on. A NaN
    or infinite value is refused, naming the row: null, not NaN, means "none"."""
    if D3S_ADVANTAGE not in batch.column_names:
        return adv
    column = batch.column(D3S_ADVANTAGE)
    if column.null_count == len(column):
        return adv
    values = column.to_numpy(zero_copy_only=False).astype(np.float64)  # null -> NaN
    given = np.asarray(column.is_valid().to_numpy(zero_copy_only=False), bool)
    bad = np.flatnonzero(given & ~np.isfinite(values))
    if len(bad):
        raise ValueError(f"{stage}: batch row {int(bad[0])!r} has {D3S_ADVANTAGE}="
                         f"{float(values[bad[0]])!r}; it must be finite, or null for none")
    return np.where(given, values, np.asarray(adv, np.float64))


def selected_masks(masks: Sequence[np.ndarray], advantages: Sequence[float],
              entropies: Sequence[np.ndarray], ratio: float | None,
              selector: str = "d3s") -> list[np.ndarray]:
    """``masks`` narrowed to the token selector's kept tokens (stages.train.selection;
    D³S's by default): it ranks only the tokens already in the loss (``masks`` true), by
    ``|A_i| * H_{i,t}`` for D³S, and keeps the ``ratio`` share of them."""
    if ratio is None or ratio >= 1.0:
        return [np.asarray(m, bool) for m in masks]
    inside = [np.asarray(h, float)[np.asarray(m, bool)] for m, h in zip(masks, entropies)]
    kept = TOKEN_SELECTORS.get(selector, d3s_tokens)(list(advantages), inside, ratio)
    out = []
    for m, k in zip(masks, kept):
        narrowed = np.asarray(m, bool).copy()
        narrowed[narrowed] = k
        out.append(narrowed)
    return out


d3s_masks = selected_masks
"""The name :func:`selected_masks` had while D³S was its only selector."""
