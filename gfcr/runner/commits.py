"""Step commits behind the loop: step k's store commit runs while step k+1 generates.

A default step spends about a tenth of its time in its DuckLake commit (catalog
transaction, Parquet file); none of the next step's work depends on it, except reading
the run's history as of step k. So the executor hands the commit task to a background
thread (Prefect: ``task.submit`` to the flow's task runner, so it is still the task run
``commit[step=k]``) and :class:`BackgroundCommits` keeps the guarantees a synchronous
commit gave:

- **Order, one at a time.** Handing over commit k+1 first waits for commit k, so the
  store always holds a prefix of the run's steps (what resume relies on).
- **Before whatever depends on it.** The history a step reads is built on first use
  (:class:`LazyHistory`) and waits for the step before's commit first; the executor
  waits before each checkpoint (a checkpoint is written after its step's commit, see
  gfcr.checkpoints.resume) and before the run ends, failed or not.
- **Errors surface.** A failed commit raises from the next wait or hand-over, and keeps
  raising (it is never swallowed by a later wait): the run fails with it, and no later
  step is committed or checkpointed after a step that is not.

So a crash loses at most what a synchronous commit would have: the step whose commit was
in flight is absent from the store (the transaction is atomic), no checkpoint is newer
than the last committed step, and a resume reruns it.

The runtime's two pieces of this are here too: :func:`recording` notes each commit's
snapshot and :func:`pinned_history` gives each step its lazily built, pinned history.
"""

from __future__ import annotations

from typing import Any, Callable, cast

import pyarrow as pa

from gfcr.core.services import Pending
from gfcr.core.storage import History, RunStore, backend

Start = Callable[..., Pending]
"""``start(name, fn, *args)``: begin ``fn(*args)`` as the task ``name`` in the background."""


class BackgroundCommits:
    """The loop's ``Runtime.background``: one commit in flight, in step order."""

    def __init__(self, start: Start) -> None:
        self._start = start
        self._pending: Pending | None = None
        self._failed: BaseException | None = None

    def __call__(self, name: str, fn: Callable[..., Any], *args: Any) -> None:
        """Wait for the commit before (raising its error), then start this one."""
        self.wait()
        self._pending = self._start(name, fn, *args)

    def wait(self) -> None:
        """Return once no commit is in flight; raise if any commit failed."""
        if self._pending is not None:
            try:
                self._pending.result()
            except Exception as exc:  # the commit's own error; an interrupt of this
                self._failed = exc    # wait (Ctrl-C) leaves it pending, waited again
            self._pending = None
        if self._failed is not None:
            raise self._failed


class LazyHistory:
    """A History reader built on first use, by ``build()``; see the module docstring.

    Stages see it as the History it builds (attributes are forwarded), so a step that
    reads no history never waits for the commit behind it.
    """

    def __init__(self, build: Callable[[], History]) -> None:
        self._build: Callable[[], History] | None = build
        self._history: History | None = None

    # getattr: a lazy proxy for the step's History: resolves on first use
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("_build", "_history"):
            raise AttributeError(name)
        return getattr(self.resolve(), name)  # the proxy's forwarding

    def resolve(self) -> History:
        """The History itself (built now if not yet)."""
        if self._build is not None:
            self._history, self._build = self._build(), None
        assert self._history is not None
        return self._history

    def __repr__(self) -> str:
        return repr(self._history) if self._build is None else "LazyHistory(not read yet)"


def recording(commit: Callable[..., Any], snapshots: dict[int, int]) -> Callable[..., Any]:
    """``commit`` that notes each step's snapshot, so the next step's history is pinned
    without searching the store's snapshot list (a query that grows with the run)."""
    def commit_step(run_id: str, step: int, rollouts: pa.Table, **kw: Any) -> Any:
        result = commit(run_id, step, rollouts, **kw)
        if result.snapshot is not None:
            snapshots[step] = result.snapshot
        return result
    return commit_step


def pinned_history(store: RunStore, run_id: str, snapshots: dict[int, int],
                   commits: BackgroundCommits) -> Callable[[int], History]:
    """The run's history as of the step before ``step``: what a resumed run sees too. At
    step 0 that is the store before the run's first commit (live, until it has one).
    Built when a stage first reads it, after the commit running behind the step."""
    history = backend().history

    def at(step: int) -> History:
        commits.wait()
        if step and step - 1 in snapshots:
            return history(store, run_id, as_of_snapshot=snapshots[step - 1])
        if step:
            return history(store, run_id, as_of_step=step - 1)
        first = store.step_snapshot(run_id, 0)
        return history(store, run_id, as_of_snapshot=None if first is None else first - 1)
    # the lazy proxy forwards every History read to the history it builds
    return lambda step: cast(History, LazyHistory(lambda: at(step)))
