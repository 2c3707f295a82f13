"""Executors: how a run's stage calls are carried out (in-process, or as Prefect tasks).

A run's body (``gfcr.launch.run``) is written against two callables: ``call(name, fn, *args)``
runs one stage call and returns its result, ``start(name, fn, *args)`` begins one in the
background (the step commit behind the next step, :mod:`gfcr.runner.commits`). An
:class:`Executor` supplies both and runs the body. Both executors run the same loop code
with the same seeds, so they give the same results.

Under Prefect a pipeline run is one flow run; every stage of every step is one task run
named ``<stage>[step=N]``, plus ``warmstart``, ``evaluate[...]``, ``checkpoint[step=N]``
and ``commit[step=N]``. Tasks pass :class:`~gfcr.runner.loop.TableRef` references to tables that
stay in the flow's process; the engine, the policy and the store connection stay there
for the whole run too. Inside a flow run (the module-level flow of :mod:`gfcr.launch.flow`, which
``gfcr run`` and deployments run) the tasks run in that flow; called from Python outside
any flow, :class:`PrefectExecutor` wraps the body in a flow of its own.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Collection, Protocol, TypeVar

from gfcr.runner.commits import Start

Call = Callable[..., Any]
"""``call(name, fn, *args)``: run ``fn(*args)`` as the stage call ``name``; its result."""

R = TypeVar("R")
Body = Callable[[Call, Start], R]

FLOW_NAME = "gfcr"
"""The name of every gfcr flow, module-level or ad hoc, so the UI lists runs together."""


class Executor(Protocol):
    """Runs a run's body with its ``call`` and ``start``. ``retried``: labels of the
    stages whose calls may be retried (the loop's generate and filter stages, which are
    idempotent under their step seed)."""

    def run(self, body: Body[R], *, run_id: str, retried: Collection[str] = ()) -> R: ...


class LocalExecutor:
    """Plain calls in this thread; background commits on one helper thread."""

    def run(self, body: Body[R], *, run_id: str, retried: Collection[str] = ()) -> R:
        with ThreadPoolExecutor(1, thread_name_prefix="gfcr-commit") as pool:
            return body(lambda name, fn, *args: fn(*args),
                        lambda name, fn, *args: pool.submit(fn, *args))


class PrefectExecutor:
    """Every call a Prefect task run; commits submitted to the flow's task runner."""

    def run(self, body: Body[R], *, run_id: str, retried: Collection[str] = ()) -> R:
        from prefect import flow
        from prefect.context import FlowRunContext

        tasks = _Tasks(frozenset(retried))

        def call(name: str, fn: Callable[..., Any], *args: Any) -> Any:
            return tasks(name)(name=name, fn=fn, args=args)

        def start(name: str, fn: Callable[..., Any], *args: Any) -> Any:
            return tasks(name).submit(name=name, fn=fn, args=args)  # the flow's thread pool

        def in_flow() -> R:
            result = body(call, start)
            _summary_artifact(result, run_id)
            return result

        if FlowRunContext.get() is not None:
            return in_flow()

        def gfcr_run() -> R:
            return in_flow()
        return flow(name=FLOW_NAME, flow_run_name=run_id, validate_parameters=False,
                    persist_result=False, log_prints=False)(gfcr_run)()


class _Tasks:
    """``tasks(name)``: the Prefect task for a call named ``<stage>[...]``, one per stage
    label (or ``commit``, ``evaluate``, ...), built on first use and reused by every
    step, since building a task reads and hashes its function's source. Each call is
    still its own task run, named ``name``. Calls of ``retried`` labels retry twice."""

    def __init__(self, retried: frozenset[str]) -> None:
        self.retried = retried
        self.built: dict[str, Any] = {}

    def __call__(self, name: str) -> Any:
        from prefect import task
        from prefect.cache_policies import NO_CACHE

        label = name.split("[", 1)[0]
        if label not in self.built:
            retries = 2 if label in self.retried else 0
            self.built[label] = task(name=label, task_run_name="{name}",
                                     retries=retries, retry_delay_seconds=1,
                                     retry_condition_fn=_retryable,
                                     cache_policy=NO_CACHE, persist_result=False)(_invoke)
        return self.built[label]


def _retryable(task: Any, task_run: Any, state: Any) -> bool:
    """Whether a failed call may be retried: not when its error says a retry cannot help
    (an attribute ``gfcr_retry = False``: no engine worker on a pool, a refused call)."""
    error = state.data  # a failed call's state holds its exception
    return getattr(error, "gfcr_retry", True) is not False  # getattr: any exception type


def _summary_artifact(result: Any, run_id: str) -> None:
    """A finished run's headline numbers and report link, as the flow run's markdown
    artifact (gfcr.report.publish)."""
    from prefect.artifacts import create_markdown_artifact

    from gfcr.report.publish import markdown

    create_markdown_artifact(markdown=markdown(result), key="gfcr-run-summary",
                             description=f"gfcr run {run_id}: headline numbers and its report")


def _invoke(name: str, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    """What every task runs: the loop's call ``fn(*args)`` (``name`` names the run)."""
    return fn(*args)


EXECUTORS: dict[str, Executor] = {"prefect": PrefectExecutor(), "local": LocalExecutor()}
"""The executors by the name ``gfcr run --executor`` and ``execute(executor=...)`` take."""


def named(name: str) -> Executor:
    """The executor called ``name``; ValueError naming the choices otherwise."""
    if name not in EXECUTORS:
        raise ValueError(f"unknown executor {name!r}; choose one of {sorted(EXECUTORS)}")
    return EXECUTORS[name]
