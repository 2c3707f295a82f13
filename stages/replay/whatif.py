"""What-if replay: re-score or re-filter a past run's stored rollouts, generating nothing.

Every rollout a run generated is in the store with its scores and the decision of each
filter, so "what would a stricter verifier, another reward, or DAPO's filter have done
to this run?" is a replay of filter stages over stored rows, not a new run. This is the
offline re-scoring that no RL framework offers (../shared/notes/rl-frameworks.md §3.6).

:func:`what_if` runs filter stages (any registered ``filter`` config: verifiers that
write ``reward``, gates that return a keep mask) over the run's complete, original rows
step by step, exactly as the loop runs filters: each filter sees the step's complete
rows with the run's task and seed in its context and the run's history as of the
previous step; a keep mask only drops rows still kept (``gfcr.core.filters.drop``). With
``base="kept"`` the stages come after the run's own filters (rows the run dropped stay
dropped); with ``base="all"`` every row starts kept and only these stages decide. The
store is opened read-only by the caller and never written.

    gfcr replay what-if RUN --filter 'type=dynamic_sampling'
    gfcr replay what-if RUN --filter '{type: verify, scorer: exact}' --base all

>>> report = what_if(store, "default-20260101-0000-ab12", [DynamicSampling()])  # doctest: +SKIP
>>> report.totals["kept_after"], report.totals["reward_after"]  # doctest: +SKIP
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import yaml

from gfcr.core import storage
from gfcr.core.rollout import col
from gfcr.core.row_filter import ASCENDING, RowFilter
from gfcr.core.stage import FILTER, StageSpec, StepContext
from gfcr.core.registry import lookup
from gfcr.core.storage import History
from gfcr.core.filters import applied, set_column
from stages.replay import _reads

Base = Literal["kept", "all"]


@dataclass(frozen=True)
class WhatIf:
    """How the kept set and rewards of a run would change under other filter stages.

    ``totals`` and each entry of ``steps`` hold: rows, kept_before, kept_after,
    newly_dropped, newly_kept, groups_before, groups_after, rewards_changed,
    reward_before, reward_after (mean over scored rows), kept_reward_before,
    kept_reward_after (mean over kept rows). ``reasons`` counts the new drop reasons by
    stage; ``rows`` is the per-rollout comparison.
    """

    run_id: str
    stages: list[str]
    base: str
    totals: dict[str, float]
    steps: list[dict[str, float]] = field(default_factory=list)
    reasons: dict[str, int] = field(default_factory=dict)
    rows: pa.Table | None = None

    def as_dict(self) -> dict[str, Any]:
        """Plain data for JSON (without the per-row table)."""
        def clean(d: dict[str, float]) -> dict[str, float | None]:
            return {k: None if isinstance(v, float) and np.isnan(v) else v for k, v in d.items()}
        return {"run_id": self.run_id, "stages": self.stages, "base": self.base,
                "totals": clean(self.totals), "steps": [clean(s) for s in self.steps],
                "reasons": self.reasons}


def what_if(store: Any, run_id: str, stages: Sequence[StageSpec], *, base: Base = "kept") -> WhatIf:
    """Replay ``stages`` (filter configs) over the stored rollouts of ``run_id``."""
    for s in stages:
        if not (isinstance(s, StageSpec) and s.kind == "filter"):
            kind = s.kind if isinstance(s, StageSpec) else type(s).__name__
            raise ValueError(f"what-if: stage {s!r} is not a filter stage (kind {kind!r})")
    if base not in ("kept", "all"):
        raise ValueError(f"what-if: base must be 'kept' or 'all', got {base!r}")
    task, seed = run_task(store, run_id)
    order = ((col.STEP, ASCENDING), (col.GROUP_ID, ASCENDING), (col.SAMPLE_IDX, ASCENDING))
    stored = _reads.as_rollouts(storage.backend().history(store, run_id).rows(
        RowFilter(status=("complete",), replayed=False), order_by=order))
    before, after = [], []
    for step in sorted(set(stored.column(col.STEP).to_pylist())):
        rows = stored.filter(pc.equal(stored.column(col.STEP), step))
        ctx = StepContext(run_id=run_id, step=step, seed=seed, task=task,
                          policy_version=int(pc.max(rows.column(col.POLICY_VERSION_END)).as_py()),
                          history=_history(store, run_id, step))
        before.append(rows)
        after.append(replay_filters(ctx, rows, stages, base=base))
    return _report(run_id, [s.label for s in stages], base, before, after)


def replay_filters(ctx: StepContext, rows: pa.Table, stages: Sequence[StageSpec], *,
                   base: Base) -> pa.Table:
    """``rows`` after ``stages``, applied as the loop applies filters."""
    if base == "all":
        n = rows.num_rows
        rows = set_column(rows, col.KEPT, pa.array([True] * n))
        for name in (col.DROPPED_BY, col.DROP_REASON):
            rows = set_column(rows, name, pa.nulls(n, pa.string()))
    for s in FILTER.of(stages):
        result = s.apply(ctx, rows)
        if result.table.num_rows != rows.num_rows:
            raise ValueError(f"what-if: filter {s.label!r} returned {result.table.num_rows} rows "
                             f"for {rows.num_rows}")
        rows = applied(result, s.label)
    return rows


def run_task(store: Any, run_id: str) -> tuple[Any, int]:
    """The task component and seed of ``run_id``, from the spec the store recorded."""
    found = storage.backend().reads(store).run(run_id)
    if found is None:
        raise ValueError(f"what-if: no run {run_id!r} in store {store.uri!r}")
    spec = yaml.safe_load(found["spec_yaml"])
    task = spec.get("task") or {}
    return lookup("task", task["type"]).model_validate(task), int(spec.get("seed", 0))


def _history(store: Any, run_id: str, step: int) -> History | None:
    """The run's history as of the step before ``step`` (None at step 0, or when that step
    is not committed), as the loop gives it to filters."""
    if step == 0:
        return None
    backend = storage.backend()
    try:
        return backend.history(store, run_id, as_of_step=step - 1)
    except backend.errors:
        return None


def _report(run_id: str, labels: list[str], base: str, before: list[pa.Table],
            after: list[pa.Table]) -> WhatIf:
    if not before:
        return WhatIf(run_id, labels, base, _compare(None, None))
    steps = [{"step": float(b.column(col.STEP)[0].as_py()), **_compare(b, a)}
             for b, a in zip(before, after)]
    b, a = pa.concat_tables(before), pa.concat_tables(after)
    newly = _mask(b, col.KEPT) & ~_mask(a, col.KEPT)
    stage = np.asarray(a.column(col.DROPPED_BY).to_pylist(), dtype=object)[newly]
    why = np.asarray(a.column(col.DROP_REASON).to_pylist(), dtype=object)[newly]
    reasons = Counter(f"{s}: {w}" for s, w in zip(stage, why))
    rows = pa.table({"rollout_id": b.column(col.ROLLOUT_ID), "step": b.column(col.STEP),
                     "kept_before": b.column(col.KEPT), "kept_after": a.column(col.KEPT),
                     "reward_before": b.column(col.REWARD), "reward_after": a.column(col.REWARD),
                     "dropped_by_after": a.column(col.DROPPED_BY),
                     "drop_reason_after": a.column(col.DROP_REASON)})
    return WhatIf(run_id, labels, base, _compare(b, a), steps, dict(reasons), rows)


def _compare(b: pa.Table | None, a: pa.Table | None) -> dict[str, float]:
    if b is None or a is None or b.num_rows == 0:
        return {k: 0.0 for k in ("rows", "kept_before", "kept_after", "newly_dropped", "newly_kept",
                                 "groups_before", "groups_after", "rewards_changed")}
    kb, ka = _mask(b, col.KEPT), _mask(a, col.KEPT)
    rb, ra = _floats(b), _floats(a)
    groups = np.asarray(b.column(col.GROUP_ID).to_pylist(), dtype=object)
    changed = ~((rb == ra) | (np.isnan(rb) & np.isnan(ra)))
    return {"rows": float(b.num_rows), "kept_before": float(kb.sum()), "kept_after": float(ka.sum()),
            "newly_dropped": float((kb & ~ka).sum()), "newly_kept": float((ka & ~kb).sum()),
            "groups_before": float(len(set(groups[kb]))), "groups_after": float(len(set(groups[ka]))),
            "rewards_changed": float(changed.sum()),
            "reward_before": _mean(rb), "reward_after": _mean(ra),
            "kept_reward_before": _mean(rb[kb]), "kept_reward_after": _mean(ra[ka])}


def _mask(t: pa.Table, name: str) -> np.ndarray:
    return np.asarray(t.column(name).to_pylist(), dtype=bool)


def _floats(t: pa.Table) -> np.ndarray:
    values = t.column(col.REWARD).to_pylist()
    return np.asarray([np.nan if v is None else v for v in values], dtype=float)


def _mean(values: np.ndarray) -> float:
    values = values[~np.isnan(values)]
    return float(values.mean()) if len(values) else float("nan")
