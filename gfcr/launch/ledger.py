"""The rollout store as a run's launch uses it: the runtime's :class:`RunStore`, and the
run's own record (started, evaluated, finished) that only the launch writes."""

from __future__ import annotations

import os
from typing import Protocol, cast

import pyarrow as pa

from gfcr.core.storage import RunStore, backend


class RunLedger(RunStore, Protocol):
    """An open store that records runs (store.lake.Lake is one)."""

    def start_run(self, run_id: str, *, pipeline: str, spec_yaml: str, spec_hash: str,
                  code_version: str) -> bool: ...

    def finish_run(self, run_id: str, status: str, error: str | None = None) -> None: ...

    def record_evaluation(self, run_id: str, step: int, label: str, *, accuracy: float,
                          n_prompts: int, temperature: float, max_tokens: int,
                          eval_set: str = "heldout",
                          sampled: dict[str, float | int | dict[int, float]] | None = None,
                          completions: pa.Table | None = None) -> None: ...

    def last_step(self, run_id: str) -> int | None: ...


def open_ledger(uri: str | os.PathLike[str], *, read_only: bool = False) -> RunLedger:
    """The store at ``uri`` (created unless ``read_only``), as a run's launch writes it."""
    # the backend's protocol types what the runtime uses; the run's record is the launch's
    return cast(RunLedger, backend().open(uri, read_only=read_only, create=not read_only))


def reason(exc: BaseException) -> str:
    """Why a run failed, for the store's ``runs.error``: the exception, on one short line."""
    text = " ".join(f"{type(exc).__name__}: {exc}".split())
    return text if len(text) <= 500 else text[:497] + "..."


def code_version() -> str:
    """What wrote the run (``runs.code_version``)."""
    from importlib.metadata import version

    return f"gfcr {version('gfcr')}"
