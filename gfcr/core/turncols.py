"""The ``turns`` column, vectorised: the flat columns from the turns
(:func:`flat_columns`, by :func:`gfcr.core.trajectory.flat`'s rule) and the turns of a
row stored with flat columns only (:func:`single_turns`). Offsets and gathers over the
flat values, no Python loop over rows: ``gfcr.core.rollout.conform`` runs them on every
stage's output and on stored rows read back."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gfcr.core.trajectory import TURN_TYPE, TURNS_TYPE

_IDS = pa.list_(pa.int32())


def flat_columns(turns: pa.ChunkedArray | pa.Array) -> tuple[pa.Array, pa.Array, pa.Array]:
    """``prompt_ids``, ``completion_ids`` and ``logprobs`` of each row of a ``turns``
    column, by :func:`gfcr.core.trajectory.flat`'s rule (null where the row's turns are
    null). A turn whose
    ``logprobs`` are not one per token is refused, naming its row and turn."""
    turns = _list(turns).cast(TURNS_TYPE)
    per_row = _lengths(turns)
    flat_turns = pc.list_flatten(turns)
    tokens, logprobs = (pc.struct_field(flat_turns, [i]) for i in (2, 3))
    n_tok = _lengths(tokens)
    n_lp = pc.list_value_length(logprobs).to_numpy(zero_copy_only=False)
    given = np.asarray(logprobs.is_valid().to_numpy(zero_copy_only=False), bool)
    bad = np.flatnonzero(given & (np.nan_to_num(n_lp, nan=-1) != n_tok))
    if len(bad):
        row = int(np.searchsorted(np.cumsum(per_row), bad[0], side="right"))
        raise ValueError(f"row {row}: turn {int(bad[0] - (np.cumsum(per_row) - per_row)[row])} "
                         f"has {int(n_lp[bad[0]])} logprobs for {int(n_tok[bad[0]])} tokens")
    starts = np.concatenate([[0], np.cumsum(n_tok)]).astype(np.int64)
    lp_values = np.zeros(int(starts[-1]), np.float32)
    lp_values[_ranges(starts[:-1][given], n_tok[given])] = \
        pc.list_flatten(logprobs).to_numpy(zero_copy_only=False)
    first = np.cumsum(per_row) - per_row
    some = per_row > 0
    p_start = np.where(some, starts[first], 0)
    p_len = np.where(some, starts[np.minimum(first + 1, len(starts) - 1)] - p_start, 0)
    c_len = np.where(some, starts[first + per_row] - p_start - p_len, 0)
    values = pc.list_flatten(tokens)
    nulls = pa.array(~np.asarray(turns.is_valid().to_numpy(zero_copy_only=False), bool))
    prompt, completion = (pa.ListArray.from_arrays(_offsets(n), values.take(_ranges(s, n)),
                                                   mask=nulls).cast(_IDS)
                          for s, n in ((p_start, p_len), (p_start + p_len, c_len)))
    lps = pa.ListArray.from_arrays(_offsets(c_len), pa.array(
        lp_values[_ranges(p_start + p_len, c_len)], pa.float32()), mask=nulls)
    return prompt, completion, lps


def single_turns(prompt_ids: pa.ChunkedArray | pa.Array, completion_ids: pa.ChunkedArray | pa.Array,
                 logprobs: pa.ChunkedArray | pa.Array, hints: np.ndarray) -> pa.Array:
    """Per row, its turns as a single-turn rollout (for a row stored with flat columns
    only): the prompt (role user, source environment), the first ``hints[i]`` completion
    tokens as a forced prefix (role assistant, out of the loss; no turn when 0) and the
    rest as the policy's turn (in the loss), each assistant turn with its share of
    ``logprobs``."""
    prompts, completions, lps = (_list(a) for a in (prompt_ids, completion_ids, logprobs))
    p, c, n_lp = (_lengths(a) for a in (prompts, completions, lps))
    h = np.clip(hints, 0, c)
    h_lp = np.minimum(h, n_lp)
    present = np.stack([np.ones_like(h, bool), h > 0, np.ones_like(h, bool)], 1).ravel()
    kind = np.tile(np.arange(3), len(h))[present]          # 0 prompt, 1 forced, 2 policy
    tokens = np.stack([p, h, c - h], 1).ravel()[present]
    n_logprobs = np.stack([np.zeros_like(h), h_lp, n_lp - h_lp], 1).ravel()[present]
    env = kind == 0
    token_ids = pa.ListArray.from_arrays(_offsets(tokens), _interleave(prompts, completions, p, c))
    logprob_list = pa.ListArray.from_arrays(_offsets(n_logprobs), lps.flatten(),
                                            mask=pa.array(env))
    in_loss = np.arange(c.sum()) - np.repeat(np.cumsum(c) - c, c) >= np.repeat(h, c)
    mask = pa.ListArray.from_arrays(_offsets(np.where(env, 0, tokens)), pa.array(in_loss),
                                    mask=pa.array(env))
    nulls = pa.nulls(len(kind))
    turns = pa.StructArray.from_arrays(
        [pa.array(np.array(["user", "assistant", "assistant"])[kind]),
         pa.array(np.array(["environment", "forced", "policy"])[kind]),
         token_ids.cast(_IDS), logprob_list.cast(pa.list_(pa.float32())),
         mask, nulls.cast(pa.string()), nulls.cast(pa.string()), nulls.cast(pa.float64())],
        fields=list(TURN_TYPE))
    return pa.ListArray.from_arrays(_offsets(2 + (h > 0)), turns).cast(TURNS_TYPE)


def _list(values: pa.ChunkedArray | pa.Array) -> pa.Array:
    return values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values


def _lengths(values: pa.Array) -> np.ndarray:
    return (pc.list_value_length(values).fill_null(0).to_numpy(zero_copy_only=False)
            .astype(np.int64))


def _offsets(lengths: np.ndarray) -> pa.Array:
    return pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))


def _ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The indices ``starts[i] .. starts[i] + lengths[i]`` of every ``i``, concatenated."""
    lengths = np.asarray(lengths, np.int64)
    total = int(lengths.sum())
    return (np.repeat(np.asarray(starts, np.int64) - (np.cumsum(lengths) - lengths), lengths)
            + np.arange(total))


def _interleave(first: pa.Array, second: pa.Array, n_first: np.ndarray,
                n_second: np.ndarray) -> pa.Array:
    """Per row, its ``first`` values then its ``second`` values, as one flat array."""
    a, b = first.flatten().to_numpy(zero_copy_only=False), second.flatten().to_numpy(zero_copy_only=False)
    out = np.empty(len(a) + len(b), dtype=np.int32)
    out[np.arange(len(a)) + np.repeat(np.cumsum(n_second) - n_second, n_first)] = a
    out[np.arange(len(b)) + np.repeat(np.cumsum(n_first), n_second)] = b
    return pa.array(out, pa.int32())
