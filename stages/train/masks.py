"""Loss masks the trainer honours: which completion tokens the policy gradient sees.

Two upstream stages ask the trainer to leave tokens out of the loss, each through an
extra column, and only when that column is in the batch:

- a row's ``turns`` (:data:`gfcr.core.rollout.TURN_TYPE`): each assistant turn's ``mask``;
  tokens of turns without one (an environment's or a tool's) are out of the loss
  (:func:`gfcr.core.rollout.loss_mask`). A forced-prefix turn (a hint) is masked out; for a
  single-turn row the turns are derived from ``hint_tokens`` (:func:`gfcr.core.rollout.conform`),
  so both say the same. Rows without turns fall back on ``hint_tokens``:
- ``hint_tokens`` (int32, :data:`gfcr.core.rollout.HINT_TOKENS`, ADHint): the first
  ``hint_tokens`` tokens of ``completion_ids`` were forced from the reference answer, not
  sampled by the policy. They stay in the sequence (the policy's later tokens are
  conditioned on them) but are masked out of the loss, so neither their gradient nor
  their ratio counts (:func:`hint_masks`).
- ``token_keep_ratio`` (float64, :data:`gfcr.core.rollout.TOKEN_KEEP_RATIO`, D³S): keep only that share of
  the batch's loss tokens, those with the largest ``|A_i| * H_{i,t}``, where ``H`` is the
  policy's next-token entropy at the training temperature from the trainer's own forward
  pass (:func:`selected_masks`, which applies a token selector of :mod:`stages.train.selection`).

D³S also hands the trainer its advantages: ``d3s_advantage`` (float64, null = none) is
each row's advantage within its whole group, the values D³S chose the subset on. Where it
is present the learner trains the row on it, ranks the row's tokens by it (``|A|``) and
reports it as the row's ``advantage``, with no renormalisation
(:func:`override_advantages`): recomputed over the kept subset, a std-normalised estimator
would give every subset unit variance and undo the max-Var(A) choice.

Per-turn credit: ``turn_advantages`` (list<float64> per row, one entry per turn,
:data:`gfcr.core.rollout.TURN_ADVANTAGES`; GiGPO's step-level groups, IGPO's turn rewards) gives
each turn's tokens their turn's advantage; a null row or entry leaves the row's advantage
on them (:func:`token_advantages`). A row whose turns carry a non-zero advantage trains
even when its own advantage is 0 (:func:`with_turn_signal`).

Departure from D³S: the share is of the tokens of rows the learner trains on (rows with a
non-zero advantage and at least one loss token), not of every completion token in the
batch; rows without signal carry no gradient whatever their mask.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pyarrow as pa

from gfcr.core.rollout import (D3S_ADVANTAGE, HINT_TOKENS, TOKEN_KEEP_RATIO, TURN_ADVANTAGES, col,
                               loss_mask)
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


def with_turn_signal(batch: pa.Table, adv: np.ndarray) -> np.ndarray:
    """``adv`` with 1.0 on rows whose ``turn_advantages`` hold a non-zero value, so a
    row the episode-level estimator gave 0 still trains on its turns' credit; only for
    choosing the rows to train on (the update uses :func:`token_advantages`)."""
    if TURN_ADVANTAGES not in batch.column_names:
        return adv
    signal = [any(v not in (None, 0.0) for v in row or [])
              for row in batch.column(TURN_ADVANTAGES).to_pylist()]
    return np.where(np.asarray(signal, bool), 1.0, adv)


def token_advantages(batch: pa.Table, rows: Sequence[int], adv: Sequence[float],
                     lengths: Sequence[int], *, stage: str = "grpo"
                     ) -> list[np.ndarray] | None:
    """Per selected row, one advantage per completion token: each turn after the first
    gets its ``turn_advantages`` entry, or the row's ``adv`` where the entry (or the row's
    list) is null. None without the column or with every row null (the update then uses
    one advantage per row). A list whose length is not the row's turn count, or a
    non-finite entry, is refused naming the row."""
    if TURN_ADVANTAGES not in batch.column_names:
        return None
    column = batch.column(TURN_ADVANTAGES)
    if column.null_count == len(column):
        return None
    turns = batch.column(col.TURNS)
    out = []
    for i, a, n in zip(rows, adv, lengths):
        given = column[int(i)].as_py()
        trajectory = turns[int(i)].as_py() or []
        if given is None:
            out.append(np.full(n, float(a)))
            continue
        if len(given) != len(trajectory):
            raise ValueError(f"{stage}: batch row {int(i)!r} has {len(given)!r} "
                             f"{TURN_ADVANTAGES!r} but {len(trajectory)!r} turns")
        values = [float(a) if v is None else float(v) for v in given[1:]]
        if not all(np.isfinite(values)):
            raise ValueError(f"{stage}: batch row {int(i)!r} has a non-finite entry in "
                             f"{TURN_ADVANTAGES!r} ({given!r}); use null for none")
        sizes = [len(t["token_ids"] or []) for t in trajectory[1:]]
        out.append(np.repeat(np.asarray(values, np.float64), sizes))
        if len(out[-1]) != n:
            raise ValueError(f"{stage}: batch row {int(i)!r} has {len(out[-1])} completion "
                             f"tokens in its turns but {n!r} in completion_ids")
    return out


d3s_masks = selected_masks
"""The name :func:`selected_masks` had while D³S was its only selector."""
