"""Weights by version (gfcr.weights.versions): atomic publication, loading in place, pruning."""

from __future__ import annotations

import json
import os

import pytest
import torch

from gfcr.core.policy import Policy
from gfcr.runner.inprocess import InProcessHandle
from gfcr.weights.versions import MANIFEST, MissingVersion, WeightStore, directory
from stages.engines.torch_io import TORCH_IO


def _handle(model: torch.nn.Module) -> InProcessHandle:
    """``model``'s weights as the learner hands them out."""
    return InProcessHandle(Policy(model=model, tokenizer=None, io=TORCH_IO),  # type: ignore[arg-type]
                           version=0)


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))


def test_a_published_version_loads_into_another_model_in_place(tmp_path):
    store = WeightStore(directory(tmp_path, "run-1"), TORCH_IO)
    source, target = _model(1), _model(2)
    store.publish(_handle(source), 5, "run-1")
    before = target[0].weight
    store.load(target, 5)
    assert target[0].weight is before  # the same tensor, new values
    for a, b in zip(source.state_dict().values(), target.state_dict().values()):
        assert torch.equal(a, b)
    assert store.latest().version == 5


def test_a_half_written_version_is_never_seen(tmp_path):
    store = WeightStore(tmp_path / "w", TORCH_IO)
    store.publish(_handle(_model(0)), 1)
    # a publisher killed before its manifest: a temporary folder, and a version folder
    # without a manifest (as a copy by hand would leave)
    (store.where / f".tmp-v000002-{os.getpid() + 1}-abc").mkdir()
    (store.path(3)).mkdir()
    (store.path(3) / "model.safetensors").write_bytes(b"half")
    assert [p.version for p in store.versions()] == [1]
    assert store.latest().version == 1
    with pytest.raises(MissingVersion, match=r"version 3 is not published .*have \[1\]"):
        store.load(_model(0), 3)


def test_only_the_newest_versions_are_kept(tmp_path):
    store = WeightStore(tmp_path / "w", TORCH_IO, keep=2)
    model = _model(0)
    for version in range(5):
        store.publish(_handle(model), version)
    assert [p.version for p in store.versions()] == [3, 4]
    assert all((p.path / MANIFEST).is_file() for p in store.versions())
    assert sorted(p.name for p in store.where.iterdir()) == ["v000003", "v000004"]
    with pytest.raises(MissingVersion, match="version 0"):
        store.get(0)


def test_publishing_a_version_again_replaces_it(tmp_path):
    store = WeightStore(tmp_path / "w", TORCH_IO)
    store.publish(_handle(_model(0)), 7)
    store.publish(_handle(_model(1)), 7)
    target = _model(3)
    store.load(target, 7)
    assert torch.equal(target[0].weight, _model(1)[0].weight)
    assert [p.version for p in store.versions()] == [7]


def test_a_resumed_run_publishing_an_older_version_keeps_it(tmp_path):
    # issue 21 D1: a run killed three versions after its newest checkpoint resumes from
    # it and publishes that older version again; it must stay (pruning by the highest
    # numbers deleted it in the same call: MissingVersion on every resume), and the
    # versions of the abandoned future go
    store = WeightStore(tmp_path / "w", TORCH_IO, keep=3)
    for version in range(7):
        store.publish(_handle(_model(version)), version)
    assert [p.version for p in store.versions()] == [4, 5, 6]
    first = (store.path(5) / MANIFEST).read_text()
    store.publish(_handle(_model(3)), 3)  # the checkpoint's version, after the resume
    assert store.get(3).version == 3
    assert [p.version for p in store.versions()] == [3]
    store.load(_model(0), 3)
    for version in (4, 5):  # the resumed run goes on: new publications of old numbers
        store.publish(_handle(_model(10 + version)), version)
    assert [p.version for p in store.versions()] == [3, 4, 5]
    # a worker that loaded the abandoned v5 tells the new one apart (gfcr.transport.remote.worker)
    assert store.get(5).ident and store.get(5).ident not in first


def test_the_file_sync_writes_each_version_once_in_the_engine_dtype(tmp_path):
    from safetensors.torch import load_file

    from gfcr.weights.versions import FileSync

    store = WeightStore(tmp_path / "w", TORCH_IO)
    sync = FileSync(store, "run-1", dtype="bfloat16")
    source = _model(1)
    handle = InProcessHandle(Policy(model=source, tokenizer=None, io=TORCH_IO),  # type: ignore[arg-type]
                             version=4)
    sync.send(handle)
    written = store.get(4).weights
    assert {t.dtype for t in load_file(str(written)).values()} == {torch.bfloat16}
    stamp = written.stat().st_mtime_ns
    sync.send(handle)  # the same version again: not written again
    assert store.get(4).weights.stat().st_mtime_ns == stamp
    target = _model(2)
    store.load(target, 4)  # a float32 model loads the bfloat16 file, cast back
    for a, b in zip(source.state_dict().values(), target.state_dict().values()):
        assert torch.equal(a.to(torch.bfloat16).float(), b)


def test_a_published_version_is_checked_by_hash_and_folder_before_a_server_loads_it(tmp_path):
    """gfcr.weights.published (issue 30): what a fleet server accepts to load. The
    manifest carries each file's SHA-256; a changed byte, a folder outside the root and a
    manifest naming a file outside its folder are refused naming what is wrong."""
    from gfcr.weights.published import BadVersion, check

    store = WeightStore(directory(tmp_path, "run-1"), TORCH_IO)
    found = store.publish(_handle(_model(1)), 3, "run-1")
    checked = check(found.path, tmp_path)
    assert (checked.version, checked.ident) == (3, found.ident)
    assert checked.blobs == {"model.safetensors": found.weights.read_bytes()}
    with pytest.raises(BadVersion, match="not under the server's weights root"):
        check(found.path, tmp_path / "other")
    with pytest.raises(BadVersion, match="not an absolute path"):
        check(os.path.relpath(found.path), tmp_path)
    data = bytearray(found.weights.read_bytes())
    data[-1] ^= 1
    found.weights.write_bytes(bytes(data))
    with pytest.raises(BadVersion, match="changed after publication"):
        check(found.path, tmp_path)
    manifest = json.loads((found.path / MANIFEST).read_text())
    manifest["files"] = ["../../../x"]
    (found.path / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(BadVersion, match="not a plain name"):
        check(found.path, tmp_path)
