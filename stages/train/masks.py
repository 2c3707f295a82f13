"""Loss masks the trainer honours: which completion tokens the policy gradient sees, and
with which advantage. The learner reads all of it through one function,
:func:`for_batch` (a :class:`BatchMarks`), and nothing of it from the batch itself.

Two upstream stages ask the trainer to leave tokens out of the loss, each through an
extra column, and only when that column is in the batch:

- a row's ``turns`` (:data:`gfcr.core.trajectory.TURN_TYPE`): each assistant turn's
  ``mask``; tokens of turns without one (an environment's or a tool's) are out of the loss
  (:func:`gfcr.core.trajectory.loss_mask`). A forced-prefix turn (a hint) is masked out.
  Rows without turns fall back on ``hint_tokens``:
- ``hint_tokens`` (int32, :data:`gfcr.core.rollout.HINT_TOKENS`, ADHint): the first
  ``hint_tokens`` tokens of ``completion_ids`` were forced from the reference answer, not
  sampled by the policy. They stay in the sequence (the policy's later tokens are
  conditioned on them) but are masked out of the loss, so neither their gradient nor
  their ratio counts.
- ``token_keep_ratio`` (float64, :data:`gfcr.core.rollout.TOKEN_KEEP_RATIO`, D³S): keep only that share of
  the batch's loss tokens, those with the largest ``|A_i| * H_{i,t}``, where ``H`` is the
  policy's next-token entropy at the training temperature from the trainer's own forward
  pass (:func:`selected_masks`, which applies a token selector of :mod:`stages.train.selection`).

D³S also hands the trainer its advantages: ``d3s_advantage`` (float64, null = none) is
each row's advantage within its whole group, the values D³S chose the subset on. Where it
is present the learner trains the row on it, ranks the row's tokens by it (``|A|``) and
reports it as the row's ``advantage``, with no renormalisation
(:meth:`BatchMarks.advantages`): recomputed over the kept subset, a std-normalised estimator
would give every subset unit variance and undo the max-Var(A) choice.

Per-turn credit: ``turn_advantages`` (list<float64> per row, one entry per turn,
:data:`gfcr.core.rollout.TURN_ADVANTAGES`; GiGPO's step-level groups, IGPO's turn rewards) gives
each turn's tokens their turn's advantage; a null row or entry leaves the row's advantage
on them (:meth:`BatchMarks.token_advantages`). A row whose turns carry a non-zero
advantage trains even when its own advantage is 0 (:meth:`BatchMarks.signal`).

Departure from D³S: the share is of the tokens of rows the learner trains on (rows with a
non-zero advantage and at least one loss token), not of every completion token in the
batch; rows without signal carry no gradient whatever their mask.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gfcr.core.rollout import D3S_ADVANTAGE, HINT_TOKENS, TOKEN_KEEP_RATIO, TURN_ADVANTAGES, col
from gfcr.core.trajectory import loss_mask
from stages.train.selection import TOKEN_SELECTORS, d3s_tokens


@dataclass(frozen=True)
class BatchMarks:
    """What a batch asks of the loss beyond its token ids and behaviour logprobs, per
    batch row, read in one place (:func:`for_batch`)."""

    masks: list[np.ndarray]
    """Each row's loss mask over its completion: its turns' (forced, environment and tool
    tokens out); for a row without turns, False on its leading ``hint_tokens``."""
    turn_adv: list[np.ndarray | None] | None
    """Per completion token, its turn's ``turn_advantages`` entry (NaN: none, the row's
    advantage); a row's None: the row's on every token; None: no row has any."""
    override: np.ndarray | None
    """Each row's ``d3s_advantage`` (NaN: none); None without any."""
    keep_ratio: float | None
    """The token selector's share of loss tokens (:func:`keep_ratio`)."""

    def advantages(self, adv: np.ndarray) -> np.ndarray:
        """``adv`` with each row's advantage override in its place where it has one. The
        values are used as they are (no renormalisation), so the update sees the
        whole-group advantages D³S chose on."""
        if self.override is None:
            return adv
        return np.where(np.isnan(self.override), np.asarray(adv, np.float64), self.override)

    def signal(self, adv: np.ndarray) -> np.ndarray:
        """``adv`` with 1.0 on rows whose turns carry a non-zero advantage, so a row the
        episode-level estimator gave 0 still trains on its turns' credit; only for
        choosing the rows to train on (the update uses :meth:`token_advantages`)."""
        if self.turn_adv is None:
            return adv
        credit = [t is not None and bool(np.any(np.nan_to_num(t) != 0.0)) for t in self.turn_adv]
        return np.where(np.asarray(credit, bool), 1.0, adv)

    def token_advantages(self, rows: Sequence[int], adv: Sequence[float]
                         ) -> list[np.ndarray] | None:
        """Per row of ``rows`` (with its advantage ``adv``), one advantage per completion
        token: its turn's, or the row's where the turn (or the row) has none. None when no
        row has turn advantages (the update then uses one advantage per row)."""
        if self.turn_adv is None:
            return None
        out = []
        for i, a in zip(rows, adv):
            given = self.turn_adv[int(i)]
            n = len(self.masks[int(i)])
            out.append(np.full(n, float(a)) if given is None
                       else np.where(np.isnan(given), float(a), given))
        return out


def for_batch(batch: pa.Table, *, stage: str = "grpo") -> BatchMarks:
    """The batch's loss masks, per-turn advantages, advantage overrides and token share
    (:class:`BatchMarks`), each checked against the row's completion: a row whose turns,
    ``hint_tokens`` or ``turn_advantages`` do not fit its ``completion_ids``, or whose
    override or turn advantage is not finite, is refused naming it."""
    lengths = (pc.list_value_length(batch.column(col.COMPLETION_IDS)).fill_null(0)
               .to_numpy(zero_copy_only=False).astype(int))
    turns = (batch.column(col.TURNS).to_pylist() if col.TURNS in batch.column_names
             else [None] * batch.num_rows)
    hints = (batch.column(HINT_TOKENS).to_pylist() if HINT_TOKENS in batch.column_names
             else [0] * batch.num_rows)
    masks = [_mask(t, h, int(n), i, stage) for i, (t, h, n) in enumerate(zip(turns, hints,
                                                                            lengths))]
    return BatchMarks(masks, _turn_advantages(batch, turns, lengths, stage),
                      _overrides(batch, stage), keep_ratio(batch, stage=stage))


def _mask(turns: list[dict] | None, hint: int | None, n: int, row: int, stage: str
          ) -> np.ndarray:
    if turns is not None:
        mask = np.asarray(loss_mask(turns), bool)
        if len(mask) != n:
            raise ValueError(f"{stage}: batch row {row!r} has {len(mask)} completion tokens "
                             f"in its turns but {n!r} in completion_ids")
        return mask
    h = hint or 0
    if h < 0 or h > n:
        raise ValueError(f"{stage}: batch row {row!r} has {HINT_TOKENS}={h!r} but "
                         f"{n!r} completion tokens")
    mask = np.ones(n, bool)
    mask[:h] = False
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


def _overrides(batch: pa.Table, stage: str) -> np.ndarray | None:
    """Each row's ``d3s_advantage`` (NaN: null), or None without any. A NaN or infinite
    value is refused, naming the row: null, not NaN, means "none"."""
    if D3S_ADVANTAGE not in batch.column_names:
        return None
    column = batch.column(D3S_ADVANTAGE)
    if column.null_count == len(column):
        return None
    values = column.to_numpy(zero_copy_only=False).astype(np.float64)  # null -> NaN
    given = np.asarray(column.is_valid().to_numpy(zero_copy_only=False), bool)
    bad = np.flatnonzero(given & ~np.isfinite(values))
    if len(bad):
        raise ValueError(f"{stage}: batch row {int(bad[0])!r} has {D3S_ADVANTAGE}="
                         f"{float(values[bad[0]])!r}; it must be finite, or null for none")
    return np.where(given, values, np.nan)


def _turn_advantages(batch: pa.Table, turns: list[list[dict] | None], lengths: np.ndarray,
                     stage: str) -> list[np.ndarray | None] | None:
    """Per row, one ``turn_advantages`` entry per completion token (NaN: null), from the
    turns after the first; None without the column or with every row null."""
    if TURN_ADVANTAGES not in batch.column_names:
        return None
    column = batch.column(TURN_ADVANTAGES)
    if column.null_count == len(column):
        return None
    out: list[np.ndarray | None] = []
    for i, (given, trajectory, n) in enumerate(zip(column.to_pylist(), turns, lengths)):
        if given is None:
            out.append(None)
            continue
        trajectory = trajectory or []
        if len(given) != len(trajectory):
            raise ValueError(f"{stage}: batch row {i!r} has {len(given)!r} "
                             f"{TURN_ADVANTAGES!r} but {len(trajectory)!r} turns")
        values = np.asarray([np.nan if v is None else float(v) for v in given[1:]], np.float64)
        if not all(v is None or np.isfinite(v) for v in given[1:]):
            raise ValueError(f"{stage}: batch row {i!r} has a non-finite entry in "
                             f"{TURN_ADVANTAGES!r} ({given!r}); use null for none")
        sizes = [len(t["token_ids"] or []) for t in trajectory[1:]]
        per_token = np.repeat(values, sizes)
        if len(per_token) != n:
            raise ValueError(f"{stage}: batch row {i!r} has {len(per_token)} completion "
                             f"tokens in its turns but {n!r} in completion_ids")
        out.append(per_token)
    return out


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
