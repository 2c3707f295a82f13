"""Checkpoints: a run's training state at a step boundary, written whole or not at all.

A checkpoint holds what the store does not: the state after step ``k`` of the objects
that live in the worker process. Layout under the run root::

    runs/<run_id>/checkpoints/step-<k>/
        model.safetensors   the policy's weights (the learner's, gfcr.core.services.Learner)
        state.pt            learner state (optimizer, counters, anything its state_dict
                            holds, without the weights again) and RNG states: torch,
                            CUDA, numpy, Python ``random`` and the engine's sampler
        progress.json       what the run summary needs from before step k+1: held-out
                            accuracies, warm-start metrics, per-step metrics
        ahead-<s>.arrow     an asynchronous run's round-0 batch of step s, generated
                            ahead and not yet trained on (gfcr.runner.rounds)
        manifest.json       format, run id, step, spec hash, policy version, time, files
        COMPLETE            written last: a folder without it is ignored

A checkpoint is written into a hidden ``.tmp-*`` folder, each file flushed to disk, the
``COMPLETE`` marker last, and only then renamed to ``step-<k>``; a write killed midway
leaves a folder that readers skip (and the next save removes). After each save the newest
``keep`` complete checkpoints stay and older ones are deleted, so a crash during a save
always leaves the previous one. The tensor files are written and read by the policy's
framework (``Policy.io``, gfcr.core.policy.TensorIO; for torch: safetensors and
``torch.load(weights_only=True)``, stages.engines.torch_io), so this module needs no
tensor library, and nothing in a checkpoint runs code when loaded.

The per-step randomness of stages does not depend on these RNG states (``StepContext.rng``
is derived from the run seed, step, round and stage), and neither does the HF engine's
sampling under a generate stage that passes a seed; they are saved for code that draws
from the global generators or the engine's own one. How a run resumes from a checkpoint
is in :mod:`gfcr.checkpoints.resume`.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.ipc as ipc
from pydantic import BaseModel, ConfigDict

from gfcr.core.capabilities import EngineRng
from gfcr.core.policy import Policy, TensorIO
from gfcr.core.services import Learner
from gfcr.checkpoints.durable import fsync

FORMAT = 1
WEIGHTS, STATE, PROGRESS, MANIFEST, MARKER = (
    "model.safetensors", "state.pt", "progress.json", "manifest.json", "COMPLETE")
_NAME = re.compile(r"^step-(\d+)$")


class CheckpointError(RuntimeError):
    """A checkpoint cannot be read or does not fit the run loading it; names the folder."""


class Manifest(BaseModel):
    """What a checkpoint is: written as ``manifest.json``, checked when loaded."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    format: int
    run_id: str
    step: int
    """The last step whose update the weights include; the run continues at step + 1."""
    spec_hash: str
    """Spec hash of the pipeline that wrote it (steps and checkpoint settings may differ)."""
    policy_version: int
    saved_at: str
    files: tuple[str, ...]


@dataclass(frozen=True)
class Checkpoint:
    """A complete checkpoint on disk."""

    path: Path
    manifest: Manifest

    @property
    def step(self) -> int:
        return self.manifest.step


def directory(root: Path, run_id: str) -> Path:
    """Where the checkpoints of ``run_id`` live under the run root."""
    return Path(root) / "runs" / run_id / "checkpoints"


# --------------------------------------------------------------------------- saving


def save(where: Path, *, run_id: str, step: int, spec_hash: str, policy: Policy, learner: Learner,
         engine: object, progress: dict[str, Any], keep: int,
         ahead: dict[int, pa.Table] | None = None) -> Checkpoint:
    """Write the state after ``step`` to ``where/step-<step>`` atomically, then keep the
    newest ``keep`` complete checkpoints. ``policy`` is a :class:`gfcr.core.policy.Policy` (its
    tensor I/O); ``learner`` a :class:`gfcr.core.services.Learner`, which writes the weights;
    ``engine`` may have ``get_rng_state()``; ``ahead`` the batches generated ahead."""
    io = _io(policy)
    where.mkdir(parents=True, exist_ok=True)
    tmp = where / f".tmp-step-{step}-{os.getpid()}-{secrets.token_hex(3)}"
    tmp.mkdir()
    batches = {f"ahead-{s}.arrow": table for s, table in sorted((ahead or {}).items())}
    manifest = Manifest(format=FORMAT, run_id=run_id, step=step, spec_hash=spec_hash,
                        policy_version=int(learner.version),
                        saved_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                        files=(WEIGHTS, STATE, PROGRESS, *batches, MANIFEST))
    try:
        learner.save_weights(tmp / WEIGHTS)
        io.save_state({"learner": _learner_state(learner),
                       "rng": _rng_state(io, engine)}, tmp / STATE)
        (tmp / PROGRESS).write_text(json.dumps(progress))
        for file, table in batches.items():
            with ipc.new_file(tmp / file, table.schema) as out:
                out.write_table(table)
        (tmp / MANIFEST).write_text(manifest.model_dump_json(indent=2))
        for name in manifest.files:
            fsync(tmp / name)
        (tmp / MARKER).write_text(f"step {step}\n")
        fsync(tmp / MARKER)
        fsync(tmp)
        final = _move_into_place(tmp, where / f"step-{step}")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    prune(where, keep)
    return Checkpoint(final, manifest)


def _move_into_place(tmp: Path, final: Path) -> Path:
    """Rename ``tmp`` to ``final``; a folder already there (a killed write of the same
    step, or the same state saved again) is moved aside first and then deleted."""
    old = None
    if final.exists():
        old = final.with_name(f".old-{final.name}-{secrets.token_hex(3)}")
        os.replace(final, old)
    os.replace(tmp, final)
    fsync(final.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return final


def prune(where: Path, keep: int) -> None:
    """Delete all but the newest ``keep`` complete checkpoints, and leftovers of killed
    writes (incomplete ``step-*`` folders, ``.tmp-*`` and ``.old-*`` folders)."""
    kept = {c.path.name for c in complete(where)[-keep:]}
    for path in where.iterdir():
        if path.is_dir() and path.name not in kept and (
                _NAME.match(path.name) or path.name.startswith((".tmp-", ".old-"))):
            shutil.rmtree(path, ignore_errors=True)


def _learner_state(learner: Learner) -> dict[str, Any] | None:
    """The learner's state dict without the policy weights it shares with
    ``model.safetensors`` (its ``"model"`` entry, when that is the policy's own tensors)."""
    found = learner.state_dict()
    if found is None:
        return None
    state = dict(found)
    if isinstance(state.get("model"), dict) and \
            _is_policy_weights(state["model"], learner.handle().state()):
        state["model"] = "<model.safetensors>"
    return state


def _is_policy_weights(value: Any, own: Any) -> bool:
    if not isinstance(value, dict):
        return False
    return value.keys() == own.keys() and all(
        value[k].data_ptr() == own[k].data_ptr() for k in own)


def _io(policy: Policy) -> TensorIO:
    """The policy's checkpoint file I/O; a policy built without one cannot be saved."""
    io: TensorIO | None = policy.io
    if io is None:
        raise CheckpointError("the policy has no tensor I/O (gfcr.core.policy.Policy.io), so it "
                              "cannot be checkpointed; its policy component must set one "
                              "(stages.engines.torch_io.TORCH_IO for torch models)")
    return io


def _rng_state(io: TensorIO, engine: object) -> dict[str, Any]:
    import random

    return {
        **io.rng_state(),  # "torch", "cuda", "numpy"
        "python": random.getstate(),
        "engine": engine.get_rng_state() if isinstance(engine, EngineRng) else None,
    }


# --------------------------------------------------------------------------- loading


def complete(where: Path) -> list[Checkpoint]:
    """The complete checkpoints under ``where``, oldest first (folders without the
    ``COMPLETE`` marker are skipped: their write did not finish)."""
    found = []
    for path in where.glob("step-*") if where.is_dir() else ():
        name = _NAME.match(path.name)
        if name is None or not (path / MARKER).is_file():
            continue
        try:
            manifest = Manifest.model_validate_json((path / MANIFEST).read_text())
        except (OSError, ValueError) as err:
            raise CheckpointError(f"checkpoint {str(path)!r} is marked complete but its "
                                  f"{MANIFEST} cannot be read: {err}") from err
        if manifest.step != int(name.group(1)):
            raise CheckpointError(f"checkpoint {str(path)!r} holds step {manifest.step!r} "
                                  "in its manifest, not the step its folder names")
        found.append(Checkpoint(path, manifest))
    return sorted(found, key=lambda c: c.step)


def latest(where: Path) -> Checkpoint | None:
    """The newest complete checkpoint under ``where``, or None."""
    found = complete(where)
    return found[-1] if found else None


def restore(ckpt: Checkpoint, *, policy: Policy, learner: Learner, engine: object) -> dict[str, Any]:
    """Load ``ckpt`` into the live objects (the learner's weights, its state and version,
    RNGs) and return its progress record. The generator loads the learner's weights
    after it (gfcr.launch.run)."""
    io = _io(policy)
    try:
        learner.load_weights(ckpt.path / WEIGHTS, ckpt.manifest.policy_version)
        state = io.load_state(ckpt.path / STATE)
        progress = json.loads((ckpt.path / PROGRESS).read_text())
    except (OSError, RuntimeError, ValueError) as err:
        raise CheckpointError(f"cannot load checkpoint {str(ckpt.path)!r}: {err}") from err
    _load_learner(ckpt, learner, state["learner"])
    _set_rng_state(io, state["rng"], engine)
    return progress


def ahead(ckpt: Checkpoint) -> dict[int, pa.Table]:
    """The batches generated ahead that ``ckpt`` holds, by step (gfcr.runner.rounds)."""
    found = {}
    for file in ckpt.manifest.files:
        if file.startswith("ahead-"):
            with ipc.open_file(ckpt.path / file) as reader:
                found[int(file[len("ahead-"):-len(".arrow")])] = reader.read_all()
    return found


def _load_learner(ckpt: Checkpoint, learner: Learner, state: dict[str, Any] | None) -> None:
    trains = learner.state_dict() is not None
    if trains != (state is not None):
        has = "no learner state" if state is None else "a learner state"
        raise CheckpointError(f"checkpoint {str(ckpt.path)!r} holds {has}, but the pipeline "
                              f"{'has' if trains else 'has no'} train stage")
    if state is None:
        return
    if state.get("model") == "<model.safetensors>":
        state = {**state, "model": learner.handle().state()}
    learner.load_state_dict(state)


def _set_rng_state(io: TensorIO, rng: dict[str, Any], engine: object) -> None:
    import random

    io.set_rng_state(rng)
    random.setstate(rng["python"])
    if rng["engine"] is not None and isinstance(engine, EngineRng):
        engine.set_rng_state(rng["engine"])
