"""What ``gfcr run`` prints when a run finishes: its summary as a table (held-out
accuracy, each phase credited its own share; rollouts, steps, where it is stored) and the
query that reads its rollouts, or with ``--json`` one JSON object."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:  # the run's types, imported when a command runs (a fast --help)
    from gfcr.launch.hooks import RunSummary


def accuracy_rows(before: float, warm: float | None, after: float) -> list[tuple[str, str]]:
    """Held-out accuracy of a run's summary, each phase credited its own share: the warm
    start's (before -> after it) and GRPO's (after the warm start -> the end)."""
    def share(a: float, b: float) -> str:
        return f"{a:.1%} -> {b:.1%} ({100 * (b - a):+.1f} points)"
    if warm is None:
        return [("held-out accuracy", share(before, after))]
    return [("held-out accuracy", f"{before:.1%} -> {after:.1%}"),
            ("  warm start's share", share(before, warm)),
            ("  GRPO's share", share(warm, after))]


def print_summary(s: RunSummary, out: Console, *, as_json: bool = False) -> None:
    """The run's summary on ``out``: a table, or with ``as_json`` one JSON object (no
    history, on standard output)."""
    if as_json:
        print(json.dumps({k: v for k, v in s.as_dict().items() if k != "history"}, default=str))
        return
    view = Table(title=f"run {s.run_id}", show_header=False)
    for key, value in [
        *accuracy_rows(s.accuracy_before, s.accuracy_warmstart, s.accuracy_after),
        ("rollouts stored", str(s.rollouts)), ("steps", str(s.steps)),
        ("seconds", f"{s.seconds:.0f}"), ("store", s.store), ("mlflow", str(s.mlflow)),
    ]:
        view.add_row(key, value)
    out.print(view)
    out.print(f'query it:  gfcr sql "SELECT step, kept, dropped_by, avg(reward) FROM rollouts '
              f"WHERE run_id = '{s.run_id}' GROUP BY ALL ORDER BY step\"")
