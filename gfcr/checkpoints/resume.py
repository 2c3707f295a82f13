"""Resuming a run: whether a pipeline may continue it, and the check on replayed steps.

Running a pipeline under the id of a run the store already holds continues that run; it
never restarts it. The run goes on from its newest complete checkpoint (see
:mod:`gfcr.checkpoints.checkpoint`): weights, learner and RNG states come from there, so the warm
start is skipped, and the loop continues at the step after it.

**Loses no data, duplicates nothing.** The store is the record of what a run did; a
checkpoint is the learner's state at a step boundary, written after that step's commit.
A crash between the two leaves steps ``c+1..j`` committed beyond the newest checkpoint
``c``. Resuming loads ``c`` and *replays* ``c+1..j``: it runs them again with the same
per-step seeds and the history as of the step before (what they saw the first time), and
does not commit them, since the store holds them already (the store would refuse a
second commit of a step anyway). **The learner trains on the store's rows**: a replayed
step runs its stages as it did the first time (so every stage's state and random draws
advance as they did), and its batch is then replaced by the rows the store holds for it
(:func:`stored_batch`), so the resumed weights are trained on exactly what the store
records, on any hardware. Where generation is deterministic (CPU, fixed seed) the
regenerated rows equal the stored ones; where it is not (a fleet of vLLM servers, whose
batching does not reproduce; some GPU kernels) they differ, a ``RuntimeWarning`` names
the step and how many differ, and the step's ``resume/replay_mismatch`` metric records
it, but the update trains on the batch the uninterrupted run trained on, and the run
continues at ``j+1`` from weights trained on what the store holds. ``checkpoint.every=1`` (a
checkpoint after every step) leaves nothing to replay, at the cost of a model and
optimizer write per step, which is why it is not the default.

**What may change.** The pipeline given must be the run's own: its spec, as stored in the
``runs`` table, with ``steps``, ``checkpoint.*`` and ``learner.*`` left out (so ``--steps``
can extend a run, checkpoint settings can change, and a sharded learner's checkpoint
resumes on another number of ranks, gfcr.transport.sharded) must hash the same. Anything else is
refused before the store is touched, naming both spec hashes and each field that differs.

**A stored spec means what it meant when it was stored.** ``runs.spec_yaml`` holds every
field the code of its day had, each filled in; a field it lacks did not exist then. Such a
field is read as the value that does what that code did: the value recorded in
:data:`ABSENT_MEANT` for the fields whose default changed after they were added (the tiny
policy's ``tokenizer`` was added defaulting to ``char`` and later became ``byte``), and its
default for every other field (a field is added with a default that keeps the old
behaviour). Both the resume check and the pipeline rebuilt by ``--resume RUN_ID`` read
the stored spec so; a run stored before a default changed resumes with the old value, and
a pipeline that asks for the new one is refused as a change.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from collections import Counter
from typing import Any

import pyarrow as pa
import yaml

from gfcr.core.pipeline import Pipeline
from gfcr.core.rollout import col
from gfcr.core.row_filter import RowFilter
from gfcr.core.storage import RunStore, backend

MAY_CHANGE = ("steps", "checkpoint", "learner")
"""Top-level spec fields a resumed run may change."""

ABSENT_MEANT: dict[tuple[str, str], Any] = {
    ("tiny_llama", "tokenizer"): "char",
}
"""(component or stage type, field) -> the value a stored spec that lacks the field was run
with, for each field whose default changed after it was added. Add an entry whenever a
field's default changes."""


class ResumeError(RuntimeError):
    """A run cannot be resumed with the pipeline given; the message says why."""


def identity(spec: dict[str, Any]) -> str:
    """Hash of a spec (``Pipeline.to_dict()`` data) without the fields a resume may change."""
    fixed = {k: v for k, v in spec.items() if k not in MAY_CHANGE}
    canonical = json.dumps(fixed, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def stored_run(store: RunStore, run_id: str) -> dict[str, Any] | None:
    """The ``runs`` row of ``run_id`` (spec_yaml, spec_hash, status, ...), or None."""
    return backend().reads(store).run(run_id)


def stored_pipeline(store: RunStore, run_id: str) -> Pipeline:
    """The pipeline run ``run_id`` was started with, rebuilt from its stored YAML."""
    row = stored_run(store, run_id)
    if row is None:
        raise ResumeError(f"no run {run_id!r} in store {store.uri!r} to resume "
                          "(`gfcr runs` lists the runs)")
    where = f"the stored spec of run {run_id!r}"
    data = yaml.safe_load(row["spec_yaml"])
    if not isinstance(data, dict):
        return Pipeline.from_yaml(row["spec_yaml"], where=where)  # refused, naming it
    return Pipeline(**as_stored(data))


def as_stored(spec: dict[str, Any]) -> dict[str, Any]:
    """A stored spec with each field it lacks that :data:`ABSENT_MEANT` lists filled in
    with the value it was run with (a new dict; the module docstring says why)."""
    def fill(value: Any) -> Any:
        if not isinstance(value, dict) or not isinstance(value.get("type"), str):
            return value
        meant = {field: v for (kind, field), v in ABSENT_MEANT.items() if kind == value["type"]}
        return {**meant, **value}

    out = {key: fill(value) for key, value in spec.items()}
    if isinstance(out.get("stages"), list):
        out["stages"] = [fill(stage) for stage in out["stages"]]
    return out


def _filled(spec: dict[str, Any]) -> dict[str, Any]:
    """The stored spec as the code of its day ran it, every field filled in; as stored
    when it no longer builds (the comparison then names what differs)."""
    try:
        return Pipeline(**as_stored(spec)).to_dict()
    except Exception:  # noqa: BLE001 - e.g. a stage type since removed: compare it raw
        return spec


def check(store: RunStore, run_id: str, pipeline: Pipeline) -> bool:
    """Whether ``run_id`` is an existing run that ``pipeline`` continues (True) or a new
    run (False). Raises :class:`ResumeError` when ``pipeline`` may not continue it; reads
    only, so a refused resume leaves the store as it was."""
    row = stored_run(store, run_id)
    if row is None:
        return False
    stored = _filled(yaml.safe_load(row["spec_yaml"]))
    current = pipeline.to_dict()
    if identity(stored) != identity(current):
        changes = "; ".join(_differences(stored, current)) or "(no field named)"
        raise ResumeError(
            f"cannot resume run {run_id!r} in store {store.uri!r}: it was started with "
            f"spec hash {row['spec_hash']} and this pipeline's is {pipeline.spec_hash()}; "
            f"they differ in {changes}. Only {' and '.join(MAY_CHANGE)}.* may change when "
            "a run is resumed; start a new run for anything else")
    last = store.last_step(run_id)
    if last is not None and last >= pipeline.steps:
        raise ResumeError(f"cannot resume run {run_id!r} with steps={pipeline.steps}: "
                          f"store {store.uri!r} already holds its steps 0..{last}; give "
                          f"steps >= {last + 1}")
    return True


def _differences(stored: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """``field: old -> new`` for each flattened field (outside MAY_CHANGE) that differs."""
    from gfcr.tracking.mlflow_hook import flatten

    old = flatten({k: v for k, v in stored.items() if k not in MAY_CHANGE})
    new = flatten({k: v for k, v in current.items() if k not in MAY_CHANGE})
    return [f"{key}: {old.get(key, '<absent>')} -> {new.get(key, '<absent>')}"
            for key in sorted(old.keys() | new.keys()) if old.get(key) != new.get(key)]


def stored_batch(store: RunStore, run_id: str, step: int, replayed: pa.Table
                 ) -> tuple[pa.Table, dict[str, float]]:
    """The batch a replayed ``step`` trains on: the rows the store holds for it, in the
    regenerated table's columns (and its row order when it regenerated the same ids),
    with the ``resume/replay_mismatch`` metric: how many regenerated rows differ from
    them (a warning names the step when any do)."""
    stored = backend().history(store, run_id).rows(RowFilter(step_min=step, step_max=step))
    a, b = _signature(stored), _signature(replayed)
    differ = max(sum((a - b).values()), sum((b - a).values()))
    if differ:
        warnings.warn(f"run {run_id!r}: replaying step {step} while resuming regenerated "
                      f"{differ} of {replayed.num_rows} rollouts differently from the "
                      f"{stored.num_rows} the store holds (non-deterministic generation: "
                      "a fleet, some GPU kernels); the learner trains on the stored rows",
                      RuntimeWarning, stacklevel=2)
    return _aligned(stored, replayed), {"resume/replay_mismatch": float(differ)}


def _aligned(stored: pa.Table, like: pa.Table) -> pa.Table:
    """``stored`` with ``like``'s columns and types (a column the store lacks: nulls),
    in ``like``'s row order when both hold the same rollout ids."""
    ids = stored.column(col.ROLLOUT_ID).to_pylist()
    order = like.column(col.ROLLOUT_ID).to_pylist()
    if sorted(ids) == sorted(order) and len(set(ids)) == len(ids):
        at = {rid: i for i, rid in enumerate(ids)}
        stored = stored.take(pa.array([at[rid] for rid in order], pa.int64()))
    columns = []
    for f in like.schema:
        if f.name not in stored.column_names:
            columns.append(pa.nulls(stored.num_rows, f.type))
            continue
        column = stored.column(f.name)
        try:
            columns.append(column.cast(f.type))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            columns.append(column)
    return pa.Table.from_arrays(columns, names=like.schema.names)


def _signature(table: pa.Table) -> Counter:
    ids = table.column(col.ROLLOUT_ID).to_pylist()
    completions = table.column(col.COMPLETION_IDS).to_pylist()
    return Counter((i, tuple(c or ())) for i, c in zip(ids, completions))
