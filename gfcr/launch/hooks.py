"""What a run tells its observers: the hook protocol, and the summary it ends with.

:func:`gfcr.launch.run.execute` calls each hook's methods as the run goes (progress bars,
Prefect's logs, MLflow: :class:`gfcr.tracking.mlflow_hook.MlflowHook`) and returns a
:class:`RunSummary`, which ``gfcr run`` prints.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Protocol

from gfcr.core.pipeline import Pipeline
from gfcr.core.storage import RunStore


class Hook(Protocol):
    """Observes a run from the orchestrating process (progress display, MLflow).

    Methods take keyword arguments only, so new ones can be added without breaking
    hooks written before them.
    """

    def on_start(self, *, run_id: str, pipeline: Pipeline, root: Path, resumed: bool,
                 store: RunStore, **kw: object) -> None:
        """``resumed``: the run id is an existing run, which this call continues;
        ``store``: the run's open RolloutStore."""

    def on_resume(self, *, step: int, path: Path, **kw: object) -> None:
        """A resumed run loaded the checkpoint after ``step`` from ``path``."""

    def on_phase(self, *, phase: str, **kw: object) -> None: ...

    def on_progress(self, *, phase: str, done: int, total: int, **kw: object) -> None:
        """``done`` of ``total`` units of a counted phase (warm start steps, evaluated
        prompts); see gfcr.transport.progress."""

    def on_warning(self, *, message: str, count: int, **kw: object) -> None:
        """An error repeated ``count`` times in one batch (a scorer's), reported once."""

    def on_step(self, *, step: int, metrics: dict[str, float], replayed: bool,
                cpu: dict[str, float], **kw: object) -> None:
        """``replayed``: a step of a resumed run that was committed before (see
        gfcr.checkpoints.resume); its metrics were reported when it first ran. ``cpu``: each stage's
        CPU seconds (gfcr.runner.loop.StageClock); its wall seconds are ``time/<stage>``
        metrics."""

    def on_eval(self, *, step: int, accuracy: float, **kw: object) -> None:
        """Greedy ``accuracy`` of an evaluation after ``step`` steps; ``label`` (``initial``,
        ``step=N``), ``eval_set`` (``heldout`` or an ``Evaluation.sets`` name) and
        ``metrics`` (``accuracy``, and ``mean_reward``, ``pass@k`` of a sampled one)."""

    def on_end(self, *, summary: "RunSummary", status: str, **kw: object) -> None: ...


def emit(hooks: Iterable[object], method: str, **kw: object) -> None:
    for hook in hooks:
        # getattr: hooks are keyword-only objects whose methods are all optional
        fn = getattr(hook, method, None)
        if fn is not None:
            fn(**kw)


@dataclass
class RunSummary:
    """The outcome of a run, as ``gfcr run`` prints it."""

    run_id: str
    pipeline: str
    spec_hash: str
    store: str
    mlflow: str | None
    steps: int
    rollouts: int
    accuracy_before: float
    """Held-out accuracy at the start of the run, before any training (warm start too)."""
    accuracy_warmstart: float | None
    """After the warm start, before the first step (None without a warm start)."""
    accuracy_after: float
    seconds: float
    warmstart: dict[str, float] = field(default_factory=dict)
    history: list[dict[str, float]] = field(default_factory=list)
    resumed_from: int | None = None
    """The checkpoint step this call resumed from (None: not resumed from a checkpoint)."""
    report: str | None = None
    """The run's report page (gfcr.report.publish), written at its end."""

    def as_dict(self) -> dict[str, object]:
        # getattr: the summary's own dataclass fields, by name
        return {k: getattr(self, k) for k in self.__dataclass_fields__}
