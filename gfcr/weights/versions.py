"""Weights by version: the learner's weights published to shared storage, one folder per
policy version, for a fleet's inference servers (gfcr.transport.fleet) and a sharded
learner's ranks (gfcr.transport.sharded) in other processes or on other hosts.

::

    ROOT/weights/RUN_ID/
        v000003/
            model.safetensors   the policy's weights after version 3's update (a LoRA
                                learner's: adapter_model.safetensors + adapter_config.json,
                                the adapter alone in peft's format)
            manifest.json       run id, version, time, files and their SHA-256
                                (gfcr.weights.published checks them): written last
        .tmp-v000004-...        a publication under way (never read)

A version is written into a temporary folder, its manifest last, each file fsynced, then
renamed into place, through the policy's own tensor I/O (``Policy.io``), so the runtime
needs no tensor library: a reader that finds ``vNNNNNN/manifest.json`` finds the whole version,
and a killed publisher leaves only a ``.tmp-`` folder that the next publication removes.
Pruning keeps what is still needed, never the highest numbers: the version just published
and the ``keep - 1`` below it (a server may still be asked for an older one while an
asynchronous run has batches in flight: keep more than ``max_staleness + 1``). Versions
*above* the one published belong to an abandoned future (a run killed between
checkpoints, now resumed from an older one, publishes that older version again) and go.
Each publication has its own id in the manifest, so a server that loaded "version 5" of
the abandoned future loads the resumed run's version 5 again (:meth:`WeightStore.ident`).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from gfcr.core.policy import TensorIO
from gfcr.checkpoints.durable import fsync
from gfcr.weights.published import MANIFEST, VERSION_FOLDER as _NAME, digest

WEIGHTS = "model.safetensors"


class MissingVersion(LookupError):
    """A version that was never published here, or was pruned; the message says which."""


@dataclass(frozen=True)
class Published:
    """One complete published version."""

    version: int
    path: Path
    ident: str = ""
    """This publication's id (its manifest's ``id``): a version published again after a
    resume is another publication of the same number."""

    @property
    def weights(self) -> Path:
        return self.path / WEIGHTS

    @property
    def adapter(self) -> bool:
        """Whether this version is an adapter folder (LoRA, peft's format), not whole
        weights (:class:`FolderHandle`)."""
        return (self.path / "adapter_config.json").is_file()


def directory(root: Path, run_id: str) -> Path:
    """Where ``run_id``'s weights are published under the run root."""
    return Path(root) / "weights" / run_id


class WeightStore:
    """Publish, list and load one run's weight versions in ``where``."""

    def __init__(self, where: Path, io: TensorIO, keep: int = 3) -> None:
        if keep < 1:
            raise ValueError(f"weights: keep={keep} must be at least 1")
        self.where, self.io, self.keep = Path(where), io, keep

    def path(self, version: int) -> Path:
        return self.where / f"v{version:06d}"

    def publish(self, handle: Any, version: int, run_id: str = "") -> Published:
        """Write the weights of ``handle`` (a gfcr.core.services.WeightHandle: the learner's)
        as ``version`` atomically, then prune (:meth:`prune`). Publishing a version
        already there replaces it (the same weights again after a resume)."""
        self.where.mkdir(parents=True, exist_ok=True)
        tmp = self.where / f".tmp-v{version:06d}-{os.getpid()}-{secrets.token_hex(3)}"
        tmp.mkdir()
        try:
            files = _save(handle, tmp)
            ident = secrets.token_hex(8)
            manifest = {"run_id": run_id, "version": version, "files": files, "id": ident,
                        "sha256": {name: digest(tmp / name) for name in files},
                        "published_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
            (tmp / MANIFEST).write_text(json.dumps(manifest))
            for name in (*files, MANIFEST):
                fsync(tmp / name)
            final = self.path(version)
            if final.exists():
                shutil.rmtree(final)
            os.replace(tmp, final)
            fsync(self.where)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self.prune(version)
        return Published(version, final, ident)

    def versions(self) -> list[Published]:
        """Complete versions, oldest first (a folder without its manifest is not one)."""
        if not self.where.is_dir():
            return []
        found = []
        for path in self.where.iterdir():
            match = _NAME.fullmatch(path.name)
            if match and (path / MANIFEST).is_file():
                found.append(Published(int(match.group(1)), path))
        return sorted(found, key=lambda p: p.version)

    def latest(self) -> Published | None:
        """The newest complete version, or None when none is published."""
        found = self.versions()
        return found[-1] if found else None

    def get(self, version: int) -> Published:
        """The complete ``version``; MissingVersion naming what is there otherwise."""
        path = self.path(version)
        if not (path / MANIFEST).is_file():
            have = [p.version for p in self.versions()]
            raise MissingVersion(f"weights version {version} is not published in "
                                 f"{self.where} (have {have or 'none'}; each publication "
                                 f"keeps itself and the {self.keep - 1} versions below it)")
        return Published(version, path, _ident(path))

    def load(self, model: Any, version: int) -> Published:
        """Load ``version`` into ``model`` in place."""
        found = self.get(version)
        self.io.load_weights(model, found.weights)
        return found

    def prune(self, current: int) -> None:
        """Keep what is still needed after ``current`` was published: it and the
        ``keep - 1`` versions below it. Versions above it (an abandoned future, see the
        module) and older ones go, as do leftovers of killed publications (other
        processes' ``.tmp-`` folders older than a minute)."""
        for old in self.versions():
            if old.version > current or old.version <= current - self.keep:
                shutil.rmtree(old.path, ignore_errors=True)
        for path in self.where.glob(".tmp-v*"):
            if path.is_dir() and time.time() - path.stat().st_mtime > 60 and \
                    f"-{os.getpid()}-" not in path.name:
                shutil.rmtree(path, ignore_errors=True)


@runtime_checkable
class FolderHandle(Protocol):
    """Optional on a weight handle: written as a folder of files of its own format (a
    LoRA adapter in peft's: adapter_model.safetensors + adapter_config.json, which vLLM
    loads as it is), instead of one ``model.safetensors``."""

    def save_folder(self, folder: Path, dtype: str | None = None) -> list[str]:
        """Write into ``folder``, cast to ``dtype``; the names of the files written."""
        ...


def _save(handle: Any, folder: Path) -> list[str]:
    """Write ``handle`` into ``folder``; the files written."""
    if isinstance(handle, FolderHandle):
        return list(handle.save_folder(folder))
    handle.save(folder / WEIGHTS)
    return [WEIGHTS]


def _ident(path: Path) -> str:
    """The publication id in ``path``'s manifest ("" for a manifest written before ids)."""
    try:
        return str(json.loads((path / MANIFEST).read_text()).get("id", ""))
    except (OSError, ValueError):
        return ""


class FileSync:
    """The weight sync across hosts (gfcr.core.services.WeightSync): each version published
    once to ``store``, written in the engine's ``dtype`` (None: the learner's), which a
    fleet's servers load by version (gfcr.transport.fleet)."""

    def __init__(self, store: WeightStore, run_id: str, dtype: str | None = None) -> None:
        self.store, self.run_id, self.dtype = store, run_id, dtype
        self.published: int | None = None

    def send(self, handle: Any) -> None:
        if self.published != handle.version:
            cast = _CastFolder if isinstance(handle, FolderHandle) else _Cast
            self.store.publish(cast(handle, self.dtype), handle.version, self.run_id)
            self.published = handle.version


@dataclass(frozen=True)
class _Cast:
    """``handle`` written in ``dtype``."""

    handle: Any
    dtype: str | None

    def save(self, path: Path) -> None:
        self.handle.save(path, self.dtype)


@dataclass(frozen=True)
class _CastFolder(_Cast):
    """A :class:`FolderHandle` written in ``dtype``."""

    def save_folder(self, folder: Path, dtype: str | None = None) -> list[str]:
        return list(self.handle.save_folder(folder, self.dtype))
