"""What a run shows while it runs: rich progress bars on the console, and the same
milestones in the Prefect flow run's logs.

The runner reports through hook methods (gfcr.launch.hooks.Hook): ``on_phase`` (a phase begins),
``on_progress`` (``done`` of ``total`` in a phase with counts: the warm start's steps,
evaluation's prompts), ``on_eval``, ``on_step``, ``on_warning`` (a repeated error, once per
step with its count) and ``on_end``. :class:`ProgressBars` draws them; every phase gets its
own bar with counts, elapsed time and an ETA once it has counts. :class:`PrefectMilestones`
logs phase starts, every quarter of a counted phase, evaluations and warnings to the
Prefect run logger (the flow run's page in the UI), and does nothing outside a flow run.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn,
                           TimeElapsedColumn, TimeRemainingColumn)


class ProgressBars:
    """Rich progress on stderr: one bar per phase, then one bar over the steps."""

    def __init__(self, steps: int, *, console: Console, quiet: bool) -> None:
        self.bar = Progress(TextColumn("{task.description}"), BarColumn(),
                            MofNCompleteColumn(), TimeElapsedColumn(),
                            TextColumn("eta"), TimeRemainingColumn(), console=console,
                            disable=quiet)
        self.steps = self.bar.add_task("starting (Prefect, store)", total=steps)
        self.phases: dict[str, TaskID] = {}
        self.warned: dict[str, int] = {}
        self.bar.start()

    def on_start(self, *, run_id: str, resumed: bool = False, **_: Any) -> None:
        self.bar.update(self.steps, description="building the policy and the task")
        self.bar.console.print(f"gfcr run [bold]{run_id}[/bold]{' (resumed)' if resumed else ''}")

    def on_resume(self, *, step: int, path: Path, **_: Any) -> None:
        self.bar.update(self.steps, completed=step + 1)
        self.bar.console.print(f"resumed after step {step} from {path}")

    def on_phase(self, *, phase: str, **_: Any) -> None:
        self.bar.update(self.steps, description=escape(phase))

    def on_progress(self, *, phase: str, done: int, total: int, **_: Any) -> None:
        if phase not in self.phases:
            self.phases[phase] = self.bar.add_task(escape(phase), total=total)
        self.bar.update(self.phases[phase], completed=done, total=total)

    def on_eval(self, *, step: int, accuracy: float, label: str = "",
                eval_set: str = "heldout", **_: Any) -> None:
        where = "before training" if label == "initial" else f"at step {step}"
        which = "held-out" if eval_set == "heldout" else f"{eval_set!r}"
        self.bar.console.print(f"{which} greedy accuracy {where}: {accuracy:.1%}")

    def on_warning(self, *, message: str, count: int = 1, **_: Any) -> None:
        """The first time a message comes, print it; later, count it (see on_end)."""
        if message not in self.warned:
            times = f" ({count}x)" if count > 1 else ""
            self.bar.console.print(f"[yellow]warning:[/yellow] {escape(message)}{times}",
                                   highlight=False)
            self.warned[message] = 0
        self.warned[message] += count

    def on_step(self, *, step: int, metrics: dict[str, float], **_: Any) -> None:
        self.bar.update(self.steps, advance=1, description=(
            f"step {step}  reward {metrics.get('reward_mean', float('nan')):.2f}  "
            f"kept {metrics.get('kept', 0):.0f}/{metrics.get('rollouts', 0):.0f}"))

    def on_end(self, **_: Any) -> None:
        self.close()
        for message, count in self.warned.items():
            if count > 1:
                self.bar.console.print(f"[yellow]warning[/yellow] {count}x in all: "
                                       f"{escape(message)}",
                                       highlight=False)


    def close(self) -> None:
        """Stop drawing (again: harmless)."""
        self.bar.stop()


class PrefectMilestones:
    """The console's milestones as lines of the Prefect run's log (when in a run)."""

    def __init__(self) -> None:
        self.logged: dict[str, int] = {}

    def _log(self, level: int, message: str) -> None:
        """Log to the run's API log through a child of Prefect's run logger: its own level
        (INFO) lets milestones through whatever PREFECT_LOGGING_LEVEL filters."""
        from prefect.exceptions import MissingContextError
        from prefect.logging import get_run_logger
        from prefect.logging.loggers import PrefectLogAdapter

        try:
            run_logger = get_run_logger()
        except MissingContextError:  # the local executor, or outside the flow
            return
        if not isinstance(run_logger, logging.LoggerAdapter):
            return
        base = run_logger.logger
        name = base.name if isinstance(base, logging.Logger) else "prefect.flow_runs"
        logger = logging.getLogger(f"{name}.gfcr")
        logger.setLevel(logging.INFO)
        PrefectLogAdapter(logger, dict(run_logger.extra or {})).log(level, message)

    def on_phase(self, *, phase: str, **_: Any) -> None:
        self._log(logging.INFO, f"{phase}: started")

    def on_progress(self, *, phase: str, done: int, total: int, **_: Any) -> None:
        quarter = 4 * done // max(total, 1)
        if quarter > self.logged.get(phase, 0) or done == total:
            if self.logged.get(phase) != 4:
                self._log(logging.INFO, f"{phase}: {done}/{total}")
            self.logged[phase] = quarter

    def on_eval(self, *, step: int, accuracy: float, label: str = "",
                eval_set: str = "heldout", **_: Any) -> None:
        which = "held-out" if eval_set == "heldout" else f"{eval_set!r}"
        self._log(logging.INFO, f"evaluate[{label}]: {which} accuracy {accuracy:.1%}")

    def on_warning(self, *, message: str, count: int = 1, **_: Any) -> None:
        self._log(logging.WARNING, f"{message} ({count}x)" if count > 1 else message)

    def on_step(self, *, step: int, metrics: dict[str, float], replayed: bool = False,
                **_: Any) -> None:
        """One line a step: the figures a person scans the run's log for."""
        figures = ", ".join(f"{key} {metrics[key]:.3g}" for key in
                            ("reward_mean", "pass_rate", "kept", "step_seconds")
                            if key in metrics)
        self._log(logging.INFO, f"step {step}{' (replayed)' if replayed else ''}: {figures}")
