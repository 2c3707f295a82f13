"""What the loop drives: the pipeline, its services, where tables and steps are kept."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Protocol

import pyarrow as pa

from gfcr.core.pipeline import Pipeline
from gfcr.core.services import Pending, Services
from gfcr.core.stage import StepContext, Task, Teacher
from gfcr.core.storage import Committed, History


@dataclass(frozen=True)
class TableRef:
    """A staged table: what Prefect tasks pass instead of data."""

    key: str
    rows: int


class Stash(Protocol):
    """Where tables live between stage calls (files for Prefect, memory for tests)."""

    def put(self, key: str, table: pa.Table) -> TableRef: ...

    def get(self, ref: TableRef) -> pa.Table: ...

    def forget(self, prefix: str) -> None:
        """Drop the tables whose key starts with ``prefix``; the runtime calls it once a
        step's tables are committed and no longer read."""
        ...


Call = Callable[..., Any]
"""``call(name, fn, *args)``: run ``fn(*args)`` as the task called ``name``."""


class Committer(Protocol):
    def __call__(self, run_id: str, step: int, rollouts: pa.Table, *,
                 policy_version: int, metrics: dict[str, float]) -> Committed: ...


@dataclass(frozen=True)
class Record:
    """Where a run's steps are kept: its commit and its history reads. ``Record()``
    keeps nothing and reads no history (tests and benchmarks that drive the loop)."""

    commit: Committer | None = None
    history_at: Callable[[int], History] | None = None
    """history_at(step) -> a History reader as of that step, for stages that query it."""
    background: Call | None = None
    """Runs the step's commit behind the loop (None: through ``call``, before the step
    returns). It returns at once; the executor keeps commits in step order and finishes
    each before the next step's history is read, before a checkpoint and before the run
    ends (gfcr.launch.run). The commit's inputs are fixed when it is handed over."""

    replay: Callable[[int, pa.Table], tuple[pa.Table, dict[str, float]]] | None = None
    """A resumed run's replayed step (committed before the resume): ``replay(step,
    regenerated)`` gives the batch it trains on, the rows the store holds for it, and
    metrics (gfcr.checkpoints.resume.stored_batch); None: a step trains on what it made."""

    def history(self, step: int) -> History | None:
        return self.history_at(step) if self.history_at else None

    def hand_over(self, name: str, fn: Callable[[TableRef], Any], ref: TableRef,
                  call: Call) -> None:
        """The step's commit ``fn(ref)``, behind the loop or through ``call``."""
        if self.commit is not None:
            (self.background or call)(name, fn, ref)

    def replaying(self, replay: Callable[[int, pa.Table], tuple[pa.Table, dict[str, float]]]
                  ) -> "Record":
        """The same history, committing nothing, and training on the stored rows that
        ``replay`` gives (a resumed run's replayed steps)."""
        return replace(self, commit=None, replay=replay)


@dataclass
class Planned:
    """A round-0 batch drawn ahead (gfcr.runner.rounds): its plan, generating."""

    plan: TableRef
    pending: Pending


@dataclass
class Runtime:
    """What the loop drives: the pipeline and the live objects built from it."""

    pipeline: Pipeline
    task: Task
    services: Services
    stash: Stash
    record: Record = field(default_factory=Record)
    ahead: dict[int, Planned] = field(default_factory=dict)
    """Round-0 batches of later steps, generating (``Pipeline.max_staleness``)."""


def context(rt: Runtime, run_id: str, step: int) -> StepContext:
    learner = rt.services.learner
    return StepContext(run_id=run_id, step=step, seed=rt.pipeline.seed,
                       policy_version=learner.version, task=rt.task,
                       history=rt.record.history(step),
                       teacher=learner if isinstance(learner, Teacher) else None)
