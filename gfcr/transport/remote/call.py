"""A scoring filter stage call as data: what travels from a run to a pool's worker.

A :class:`ScoreCall` holds only plain data: the stage's and the task's configs (each as
its ``model_dump``), the step, and where the tables are: the rows to score as a Parquet
file in the run's staging folder (beside the store) and the place to write the scored
rows. Tables never go through Prefect's API; the call itself is a few kilobytes in
Prefect's result storage. The step's History travels as the store's URI and the snapshot
it is pinned to: the worker opens the store read-only at that snapshot, so a stage that
reads history reads there what it reads in-process.

Two hashes check that run and worker agree. ``code_hash`` is the hash of the gfcr, stages
and store sources the run was started with; ``spec_hash`` the hash of the configs as the
run validated them. A worker recomputes both on its side (re-validating the configs with
its own classes) and refuses a call whose hashes differ from its own, naming both
(:class:`CallRefused`). Anyone can recompute them, so they authenticate nothing: the run
signs each call with its pool's key, and the worker checks that signature and where the
call's files are before anything else (:mod:`gfcr.transport.remote.keys`,
:mod:`gfcr.transport.remote.guard`).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import re
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict

POOL = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
CODE_PACKAGES = ("gfcr", "stages", "store")


class CallRefused(RuntimeError):
    """A pool's worker will not run a call made on other code or other specs."""

    gfcr_retry = False  # the same worker refuses again (gfcr.transport.executors)


class ScoreCall(BaseModel):
    """One scoring filter stage call of one step's round (gfcr.transport.remote.scoring): the rows
    to score as a Parquet file in the run's staging folder, the stage's and the task's
    configs, and where the worker writes the scored rows (with the stage's drops marked)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    run_id: str
    step: int
    round: int = 0
    quota: int | None = None
    seed: int
    policy_version: int
    stage: dict[str, Any]
    task: dict[str, Any]
    rows: str
    """Parquet file of the step's complete rollouts the stage scores."""
    out: str
    """Where the worker writes the scored rows (Parquet)."""
    code_hash: str
    spec_hash: str
    """spec_hash(stage, task)."""
    store: str | None = None
    """The run's store (its URI), which the worker opens read-only for the step's History;
    None: the run has no store, and the stage sees no history (as in-process)."""
    snapshot: int | None = None
    """The store snapshot the step's History is pinned to (None: the live store, a run's
    first step before its first commit)."""
    expires: float | None = None
    """When the run stops waiting for this call (seconds since the epoch): a worker
    refuses it later (gfcr.transport.remote.guard). None: never (a call made by hand)."""

    @property
    def name(self) -> str:
        return task_run_name(self.stage, self.step, self.round)


def task_run_name(stage: dict[str, Any], step: int, round: int) -> str:
    """A call's task run name: the stage call's, as the in-process loop names it."""
    label = stage.get("name") or stage["type"]
    suffix = f",round={round}" if round else ""
    return f"{label}[step={step}{suffix}]"


def history_at(ctx: Any) -> dict[str, Any]:
    """The call fields that name ``ctx``'s History (its store and snapshot), so a worker
    reads what the step's stages read here. Reading the snapshot builds the step's
    History, which waits for the commit running behind the step (gfcr.runner.commits)."""
    history = ctx.history
    if history is None:
        return {"store": None, "snapshot": None}
    return {"store": str(history.uri), "snapshot": history.snapshot}


def check_pool(pool: str) -> str:
    """``pool`` if it is a usable pool name (it becomes part of a Prefect task key)."""
    if not POOL.fullmatch(pool):
        raise ValueError(f"pool name {pool!r} may hold only letters, digits, '_' and "
                         "'-', start with a letter or digit, and be at most 64 long")
    return pool


def spec_hash(stage: dict[str, Any], task: dict[str, Any]) -> str:
    """sha256 (16 hex digits) of the stage's and the task's configs as canonical JSON."""
    canonical = json.dumps([stage, task], sort_keys=True,
                           separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


@functools.lru_cache(maxsize=1)
def code_hash() -> str:
    """sha256 (16 hex digits) of the Python sources of gfcr, stages and store as imported
    here: two processes agree on it only when they run the same code."""
    digest = hashlib.sha256()
    for package in CODE_PACKAGES:
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            continue
        base = Path(list(spec.submodule_search_locations)[0])
        for path in sorted(base.rglob("*.py")):
            digest.update(f"{package}/{path.relative_to(base).as_posix()}\0".encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def write_parquet(path: str | Path, table: pa.Table, *, make_folder: bool = True) -> None:
    """Write ``table`` to ``path`` atomically (temporary file, then rename): a reader
    never sees half a file, and a retried call overwrites its own output. A pool's
    worker passes ``make_folder=False``: it writes only into a staging folder its run
    made (gfcr.transport.remote.guard)."""
    path = Path(path)
    if make_folder:
        path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    pq.write_table(table, tmp)
    os.replace(tmp, path)


def read_parquet(path: str | Path) -> pa.Table:
    return pq.read_table(path)
