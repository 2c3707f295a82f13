"""A step's rewards kept within the pipeline's ``reward_range`` (gfcr.core.settings.RewardRange).

After a step's filters, a reward outside the range is clipped to it, and with
``out_of_range="drop"`` its rollout is also dropped from training (``dropped_by=
"reward_range"``; the stored reward is the clipped one, so the step's reward metrics stay
finite), with a warning that names the step, the count and the extremes; the count is the step metric ``reward_out_of_range``
(0 on a clean step). The ``rewards`` components of a clipped row are clipped to the same
range, so the advantage estimators that read them (GDPO) see bounded values too. A reward
of 1e308 no longer reaches the learner, whose advantages and loss it would make inf/NaN.
"""

from __future__ import annotations

import warnings

import numpy as np
import pyarrow as pa

from gfcr.core.rollout import col
from gfcr.core.settings import RewardRange
from gfcr.core.filters import drop, set_column

LABEL = "reward_range"
"""``dropped_by`` of rows dropped for a reward out of range, and the metric's stem."""


def bounded(table: pa.Table, bounds: RewardRange, step: int) -> tuple[pa.Table, int]:
    """``table`` with its rewards within ``bounds`` and the number of rows that were not;
    warns when there were any."""
    reward = table.column(col.REWARD).to_numpy(zero_copy_only=False).astype(np.float64)
    outside = (reward < bounds.low) | (reward > bounds.high)  # nan (unscored): False
    count = int(outside.sum())
    if not count:
        return table, 0
    verb = "clipped to it" + (" and dropped from training" if bounds.out_of_range == "drop"
                              else "")
    warnings.warn(f"step {step}: {count} reward(s) outside the pipeline's reward_range "
                  f"[{bounds.low:g}, {bounds.high:g}] (from {reward[outside].min():.3g} to "
                  f"{reward[outside].max():.3g}) were {verb}", RuntimeWarning, stacklevel=2)
    clipped = np.clip(reward, bounds.low, bounds.high)
    null = table.column(col.REWARD).is_null().to_numpy(zero_copy_only=False)
    table = set_column(table, col.REWARD, pa.array(clipped, pa.float64(), mask=null))
    entries = table.column(col.REWARDS).to_pylist()
    maps = [None if e is None else [(k, _clip(v, bounds)) for k, v in e] for e in entries]
    table = set_column(table, col.REWARDS, pa.array(maps, table.schema.field(col.REWARDS).type))
    if bounds.out_of_range == "drop":
        reason = f"reward outside reward_range [{bounds.low:g}, {bounds.high:g}]"
        table = drop(table, pa.array(outside), LABEL, pa.scalar(reason))
    return table, count


def _clip(value: float | None, bounds: RewardRange) -> float | None:
    return value if value is None or value != value else min(max(value, bounds.low), bounds.high)
