"""A run's report at its end: the page written beside the run's checkpoints (and logged to
MLflow by the MLflow hook), and a short markdown summary for Prefect's artifact."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from gfcr.core.storage import RunStore
from gfcr.report import load_runs
from gfcr.report.page import render

log = logging.getLogger("gfcr.report")


def page_path(root: Path, run_id: str) -> Path:
    return Path(root) / "runs" / run_id / "report.html"


def end_of_run_page(store: RunStore, run_id: str, root: Path) -> str | None:
    """Write the report of ``run_id`` from the run's open ``store`` (read-only queries) to
    ``ROOT/runs/RUN_ID/report.html``; its path, or None (logged) if it could not be made:
    a report is no reason to fail a run that finished."""
    path = page_path(root, run_id)
    try:
        runs = load_runs(store, [run_id])
        runs[0].run["status"] = "finished"  # the store marks it so just after this page
        html = render(runs, store=str(store.uri))
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(html, encoding="utf-8")
        tmp.replace(path)
    except Exception as e:  # noqa: BLE001 - reported, the run's result stands
        log.warning("gfcr: the report of run %s was not written: %s", run_id, e)
        return None
    return str(path)


def markdown(summary: Any) -> str:
    """The headline numbers of a finished run and where its report is, as markdown."""
    s = summary
    warm = f" → {s.accuracy_warmstart:.1%} (warm start)" if s.accuracy_warmstart is not None else ""
    rows = [("held-out accuracy", f"{s.accuracy_before:.1%}{warm} → **{s.accuracy_after:.1%}**"),
            ("steps", str(s.steps)), ("rollouts stored", str(s.rollouts)),
            ("seconds", f"{s.seconds:.0f}"), ("store", f"`{s.store}`"),
            ("report", f"`{s.report}`" if s.report else "not written (see the run's log)"),
            ("MLflow", f"`{s.mlflow}` (artifact `report.html`)" if s.mlflow else "not tracked")]
    last = s.history[-1] if s.history else {}
    if "reward_mean" in last:
        rows.insert(1, ("sampled reward, last step", f"{last['reward_mean']:.3f}"))
    table = "\n".join(f"| {k} | {v} |" for k, v in rows)
    return (f"# gfcr run {s.run_id}\n\npipeline `{s.pipeline}`, spec hash `{s.spec_hash}`\n\n"
            f"| | |\n|---|---|\n{table}\n\nOpen the report offline: `{s.report}`; "
            f"diagnose the run: `gfcr doctor {s.run_id}`.\n")
