"""What a report or a diagnosis reads from a rollout store, per run, in a few reads.

Everything is aggregated store-side (per step, per group, per stage: the store's run
views, read through ``StoreBackend.reads``, gfcr.core.storage.RunReads), so a run of a million
rollouts is read in seconds: no per-rollout row leaves the database except the few
sampled completions. The store is opened read-only by the caller; nothing here writes.

Held-out accuracy is read by :func:`accuracies` alone: from an ``evaluations`` table
where the store has one, else from the ``heldout_accuracy`` step metric.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pyarrow as pa

from gfcr.core.rollout import ROLLOUT_SCHEMA
from gfcr.core.storage import RunReads, RunStore, backend
from gfcr.report.chat import CHAT_SAMPLES
from gfcr.report.rows import Row

NEEDED_COLUMNS = ("run_id", "step", "rollout_id", "prompt_id", "group_id", "completion",
                  "prompt", "answer", "reward", "score_error", "kept", "dropped_by",
                  "drop_reason", "status", "finish_reason", "n_tokens", "replay_count",
                  "policy_version_start", "logprobs")
"""Rollout columns the report and the doctor read; a store lacking one is older than
this gfcr and gets a message saying so (rather than a SQL binder error)."""

PASS_LABELS = ("0", "(0, .25]", "(.25, .5]", "(.5, .75]", "(.75, 1)", "1")
"""Group pass-rate bins (share of a group's samples with reward >= 1): none, ..., all."""

SAMPLE_STEPS = 8
"""Steps of which the report shows sampled completions (spread over the run)."""


class ReportError(ValueError):
    """A run cannot be reported or diagnosed; the message says which and why."""


@dataclass
class RunData:
    """One run as the report and the doctor see it: per-step series aligned with ``steps``."""

    run_id: str
    run: Row
    steps: list[int]
    series: dict[str, list[float]] = field(default_factory=dict)
    """Metric name -> one value per step (NaN where a step has none)."""
    drops: dict[str, list[float]] = field(default_factory=dict)
    """"stage: reason" -> rows dropped at each step."""
    pass_dist: list[list[float]] = field(default_factory=list)
    """Per step, the share of groups in each PASS_LABELS bin."""
    accuracy: list[tuple[int, float, str]] = field(default_factory=list)
    """Held-out evaluations: (step, accuracy, label)."""
    samples: list[Row] = field(default_factory=list)
    chats: list[Row] = field(default_factory=list)
    """Sample multi-turn rows with their turns (gfcr.report.chat; none for single-turn runs)."""
    turn_figures: list[Row] = field(default_factory=list)
    """Per number of policy turns: ``episodes``, ``success``, ``policy_tokens`` (the
    ``turn_figures`` run view; one row of 1 turn for a single-turn run)."""

    def get(self, name: str) -> list[float]:
        return self.series.get(name, [math.nan] * len(self.steps))

    def has(self, name: str) -> bool:
        return any(math.isfinite(v) for v in self.series.get(name, []))


def reads(store: RunStore) -> RunReads:
    """The open ``store``'s named run reads (its backend's)."""
    return backend().reads(store)


def check_schema(store: RunStore) -> None:
    """Raise ReportError naming what an older store lacks."""
    have = set(reads(store).rollout_columns())
    missing = [c for c in NEEDED_COLUMNS if c not in have]
    if missing:
        raise ReportError(
            f"store {store.uri!r} has an older schema: its rollouts table lacks column(s) "
            f"{missing} (this gfcr writes {len(ROLLOUT_SCHEMA)} columns). Report it with the "
            "gfcr version that wrote it, or export it and re-commit with this one.")


def load_run(store: RunStore, run_id: str, *, samples: bool = True) -> RunData:
    """Everything about ``run_id`` the report shows; ReportError for an unknown or empty run."""
    read = reads(store)
    run = read.run(run_id)
    if run is None:
        known = read.latest_run_ids(5)
        raise ReportError(f"no run {run_id!r} in store {store.uri!r}; "
                          f"its latest runs: {known or 'none'} (gfcr runs lists them all)")
    step_rows = read.steps(run_id).to_pylist()
    if not step_rows:
        raise ReportError(f"run {run_id!r} in store {store.uri!r} has no committed step "
                          f"(status {run['status']!r}): nothing to report yet")
    data = RunData(run_id, run, [r["step"] for r in step_rows])
    _step_metrics(data, step_rows)
    _rollout_series(store, data)
    data.drops = _drops(store, data)
    data.pass_dist = _pass_distribution(store, data)
    data.accuracy = accuracies(store, run_id)
    data.turn_figures = reads(store).view("turn_figures", run_id).to_pylist()
    if samples:
        data.samples = _samples(store, data)
        data.chats = reads(store).chat_samples(run_id, CHAT_SAMPLES).to_pylist()
    return data


def _step_metrics(data: RunData, rows: list[Row]) -> None:
    """The steps table's metrics map, one series per metric name."""
    index = {s: i for i, s in enumerate(data.steps)}
    for row in rows:
        i = index[row["step"]]
        values = dict(row["metrics"] or []) | {"policy_version": row["policy_version"]}
        for name, value in values.items():
            series = data.series.setdefault(name, [math.nan] * len(data.steps))
            series[i] = math.nan if value is None else float(value)


def _rollout_series(store: RunStore, data: RunData) -> None:
    """Per-step aggregates over the run's rollouts (the ``report_steps`` view)."""
    table = reads(store).view("report_steps", data.run_id)
    for name, series in aligned(data.steps, table).items():
        data.series[f"store/{name}"] = series


def aligned(steps: list[int], table: pa.Table) -> dict[str, list[float]]:
    """Each column of ``table`` after its first (``step``) as a series over ``steps``:
    NaN where the table has no row for a step or a null value."""
    index = {s: i for i, s in enumerate(steps)}
    out: dict[str, list[float]] = {}
    rows = table.column("step").to_pylist()
    for name in table.column_names[1:]:
        series = [math.nan] * len(steps)
        for step, value in zip(rows, table.column(name).to_pylist()):
            if step in index and value is not None:
                series[index[step]] = float(value)
        out[name] = series
    return out


def _drops(store: RunStore, data: RunData) -> dict[str, list[float]]:
    rows = reads(store).view("drops", data.run_id).to_pylist()
    index = {s: i for i, s in enumerate(data.steps)}
    out: dict[str, list[float]] = {}
    for row in rows:  # a step committed after the steps were read (a live run) is left out
        if row["step"] not in index:
            continue
        key = f"{row['dropped_by'] or '?'}: {row['reason']}"
        out.setdefault(key, [0.0] * len(data.steps))[index[row["step"]]] = float(row["n"])
    return dict(sorted(out.items(), key=lambda kv: -sum(kv[1])))


def _pass_distribution(store: RunStore, data: RunData) -> list[list[float]]:
    """Per step, the share of the step's groups (fresh, scored) in each pass-rate bin."""
    rows = reads(store).view("pass_bins", data.run_id).to_pylist()
    index = {s: i for i, s in enumerate(data.steps)}
    counts = [[0.0] * len(PASS_LABELS) for _ in data.steps]
    for row in rows:
        if row["step"] in index:  # not a step committed after the steps were read
            counts[index[row["step"]]][row["bin"]] = float(row["n"])
    return [[c / total for c in row] if (total := sum(row)) else row for row in counts]


def accuracies(store: RunStore, run_id: str) -> list[tuple[int, float, str]]:
    """Held-out accuracies of ``run_id`` as (step, accuracy, label), by step.

    From the store's ``evaluations`` table where it has one (columns ``run_id``, ``step``,
    ``accuracy`` and, if present, ``label`` and ``evaluated_at``) where it holds the run's,
    else from the ``heldout_accuracy`` metric of the ``steps`` rows (a store from before
    that table)."""
    rows = reads(store).evaluations(run_id).to_pylist()
    return [(r["step"], float(r["accuracy"]), str(r["label"] or "")) for r in rows]


def _samples(store: RunStore, data: RunData) -> list[Row]:
    """A right, a wrong and a dropped completion at up to SAMPLE_STEPS steps of the run."""
    return reads(store).samples(data.run_id, sample_steps(data.steps)).to_pylist()


def sample_steps(steps: list[int], n: int = SAMPLE_STEPS) -> list[int]:
    """Up to ``n`` steps spread evenly over ``steps``, first and last included."""
    if len(steps) <= n:
        return list(steps)
    return sorted({steps[round(i * (len(steps) - 1) / (n - 1))] for i in range(n)})
