"""What one step did, as numbers: the loop's per-step metrics over the step's rollouts
(generated, kept, dropped and why, partial and pruned work, replayed rows). They go to the
store's ``steps`` table with the commit and to MLflow."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gfcr.core.rollout import NEW_TOKENS, col


def rollout_metrics(table: pa.Table) -> dict[str, float]:
    """Per-step counts and rates: what was generated, kept, dropped and why.

    ``tokens`` counts the completion tokens generated in this step (:func:`generated_tokens`),
    the cost a throughput or token-saving figure wants; ``row_tokens`` sums ``n_tokens``
    over the step's rows, which under APRIL also holds continued prefixes and carried-over
    samples generated in earlier steps, and replayed rows."""
    kept = table.column(col.KEPT).to_numpy(zero_copy_only=False)
    reward = table.column(col.REWARD).to_numpy(zero_copy_only=False).astype(float)
    n_tokens = table.column(col.N_TOKENS).to_numpy(zero_copy_only=False)
    scored = ~np.isnan(reward)
    out = {
        "rollouts": float(table.num_rows),
        "kept": float(kept.sum()),
        "kept_groups": float(len(set(table.filter(table.column(col.KEPT))
                                     .column(col.GROUP_ID).to_pylist()))),
        "tokens": float(generated_tokens(table).sum()),
        "row_tokens": float(n_tokens.sum()),
        "gen_seconds": float(np.max(table.column(col.GEN_SECONDS).to_numpy(), initial=0.0)),
        "reward_mean": float(reward[scored].mean()) if scored.any() else float("nan"),
        "pass_rate": float((reward[scored] >= 1.0).mean()) if scored.any() else float("nan"),
    }
    dropped = table.filter(pc.invert(table.column(col.KEPT)))
    for stage, count in _counts(dropped.column(col.DROPPED_BY)).items():
        out[f"dropped/{stage}"] = float(count)
    out.update(_control_metrics(table, n_tokens))
    out.update(_replay_metrics(table, n_tokens, kept))
    return out


def generated_tokens(table: pa.Table) -> np.ndarray:
    """Per row, the completion tokens generated in this step: the generate stage's
    ``new_tokens`` (:data:`gfcr.core.rollout.NEW_TOKENS`; ``n_tokens`` where it wrote none),
    and 0 for a replayed row (``replay_count > 0``), which was generated in an earlier
    step. So a continued partial counts only its new tokens, a carried sample none."""
    n_tokens = table.column(col.N_TOKENS).cast(pa.int64())
    new = n_tokens
    if NEW_TOKENS in table.column_names:
        new = pc.coalesce(table.column(NEW_TOKENS).cast(pa.int64()), n_tokens)
    out = new.to_numpy(zero_copy_only=False).astype(np.int64)
    out[table.column(col.REPLAY_COUNT).to_numpy(zero_copy_only=False) > 0] = 0
    return out


def _control_metrics(table: pa.Table, n_tokens: np.ndarray) -> dict[str, float]:
    """Partial (to be continued) and pruned rollouts, the shares of rollouts and of stored
    tokens pruned (ARRoL reports both), and rows with a parent (continued, branched)."""
    status = np.asarray(table.column(col.STATUS).to_pylist(), dtype=object)
    pruned = status == "pruned"
    return {"partial": float((status == "partial").sum()), "pruned": float(pruned.sum()),
            "pruned_frac": float(pruned.mean()) if len(status) else 0.0,
            "pruned_token_frac": float(n_tokens[pruned].sum()) / max(float(n_tokens.sum()), 1.0),
            "with_parent": float(table.num_rows - table.column(col.PARENT_ID).null_count)}


def _replay_metrics(table: pa.Table, n_tokens: np.ndarray, kept: np.ndarray) -> dict[str, float]:
    """Rows reused from earlier steps (``replay_count > 0``; nothing was generated for
    them now): count, tokens, share of the kept batch, and staleness in policy versions
    against the newest version among the step's new rows (the policy generating now)."""
    replayed = table.column(col.REPLAY_COUNT).to_numpy(zero_copy_only=False) > 0
    out = {"replay/rows": float(replayed.sum()), "replay/tokens": float(n_tokens[replayed].sum()),
           "replay/share": float((replayed & kept).sum() / kept.sum()) if kept.any() else 0.0}
    if replayed.any():
        start = table.column(col.POLICY_VERSION_START).to_numpy(zero_copy_only=False)[replayed]
        end = table.column(col.POLICY_VERSION_END).to_numpy(zero_copy_only=False)
        stale = (end[~replayed].max() if (~replayed).any() else end.max()) - start
        out["replay/staleness_mean"] = float(stale.mean())
        out["replay/staleness_max"] = float(stale.max())
    return out


def _counts(column: pa.ChunkedArray) -> dict[str, int]:
    if not len(column):
        return {}
    counts = pc.value_counts(column.combine_chunks())
    return {str(c["values"]): int(c["counts"]) for c in counts.to_pylist()}

