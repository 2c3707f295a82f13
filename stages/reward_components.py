"""A rollout batch's named reward components as one array: the ``rewards`` column
(``MAP<string, double>``, one entry per scorer component) turned into the ``[N, K]``
array an estimator that reads components (``gdpo``, :mod:`stages.advantages`) takes.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np


def reward_components(entries: Sequence[Mapping[str, float] | Sequence[tuple[str, float]]
                                        | None]) -> tuple[list[str], np.ndarray]:
    """The rollout ``rewards`` column (MAP<string, double>, as ``to_pylist`` gives it: a
    list of ``(key, value)`` pairs per row, or dicts) as ``(sorted names, [N, K] array)``
    for ``gdpo``. Every row must carry the same keys; the ValueError names the row."""
    rows: list[dict[str, Any]] = [dict(e) if e is not None else {} for e in entries]
    names = sorted(set().union(*rows)) if rows else []
    out = np.zeros((len(rows), len(names)))
    for i, row in enumerate(rows):
        if sorted(row) != names:
            raise ValueError(f"reward_components: row {i!r} has components {sorted(row)!r}, "
                             f"the batch has {names!r}")
        out[i] = [row[k] for k in names]
    if not np.all(np.isfinite(out)):
        raise ValueError("reward_components: component values must be finite")
    return names, out
