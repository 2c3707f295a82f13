"""What ``gfcr doctor`` reads beyond the report's per-step series: group statistics,
partial credit, score errors and prompt coverage: the store's run views (``group_facts``,
``partial_credit``, ``repeated_wrong``, ``score_errors``, ``prompt_coverage``; store.run_views),
read-only, through ``StoreBackend.reads``."""

from __future__ import annotations

from dataclasses import dataclass, field

from gfcr.core.storage import RunStore
from gfcr.report.data import RunData, aligned, load_run, reads
from gfcr.report.rows import Row


@dataclass
class Facts:
    """A run's figures the checks judge; series are aligned with ``run.steps``."""

    run: RunData
    group: dict[str, list[float]] = field(default_factory=dict)
    """Per step over fresh scored groups: ``groups``, ``zero_variance`` (share with one
    reward value), ``identical`` (share whose completions are all the same text; ``identical_wrong``:
    and none of them right),
    ``duplicate`` (mean share of a group's samples that repeat another's)."""
    partial: dict[str, list[float]] = field(default_factory=dict)
    """Per step: ``rewarded_wrong`` (share of rows with 0 < reward < 1) and
    ``wrong_reward_mass`` (their share of all positive reward)."""
    repeated_wrong: list[Row] = field(default_factory=list)
    """Completions paid partial credit on the most distinct prompts."""
    errors: list[Row] = field(default_factory=list)
    """The commonest score errors with their counts."""
    turns: Row = field(default_factory=dict)
    """Multi-turn episodes' figures (``RunReads.episode_figures``; zeros for a single-turn run)."""
    prompts: Row = field(default_factory=dict)
    """``sampled``, ``attempted``, ``never_solved`` (attempted >= 2 steps, no success),
    ``draws`` and, where the task can be rebuilt from the stored spec, ``train``."""


def gather(store: RunStore, run_id: str) -> Facts:
    """The run's data (ReportError for an unknown or empty run) and the doctor's extras."""
    run = load_run(store, run_id, samples=False)
    facts = Facts(run)
    read = reads(store)
    facts.group = aligned(run.steps, read.view("group_facts", run_id))
    facts.partial = aligned(run.steps, read.view("partial_credit", run_id))
    facts.repeated_wrong = read.view("repeated_wrong", run_id).to_pylist()
    facts.errors = read.view("score_errors", run_id).to_pylist()
    facts.prompts = read.view("prompt_coverage", run_id).to_pylist()[0]
    facts.prompts["train"] = _train_size(store, run_id)
    facts.turns = read.episode_figures(run_id)
    return facts


def _train_size(store: RunStore, run_id: str) -> int | None:
    """How many training prompts the run's task has, from its stored spec (None when the
    spec's task cannot be rebuilt here, e.g. a plugin that is not installed)."""
    from gfcr.checkpoints.resume import stored_pipeline

    try:
        return int(stored_pipeline(store, run_id).task.train_prompts().num_rows)
    except Exception:  # noqa: BLE001 - any failure only means "unknown"
        return None
