"""Reading back what W&B wrote offline: a run's ``run-<id>.wandb`` file.

The file is W&B's record log (a 7-byte header ``:W&B``, magic 0xBEE1, version; then
LevelDB's log format: 32 KiB blocks of records, each with a 7-byte header of checksum,
length and type FULL/FIRST/MIDDLE/LAST) of ``wandb_internal_pb2.Record`` messages. wandb
0.31 ships no reader of it (``wandb sync`` uploads it), so the tests read it here."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any, Iterator

_BLOCK, _HEADER = 32768, 7


def records(path: Path) -> Iterator[Any]:
    """The ``Record`` messages of ``path``, in order."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    ident, magic, _version = struct.unpack("<4sHB", data[:_HEADER])
    assert (ident, magic) == (b":W&B", 0xBEE1), f"{path} is not a W&B run file"
    pos, chunk = _HEADER, b""
    while pos + _HEADER <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < _HEADER:  # a block's tail too short for a header is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + _HEADER])
        if length == 0 and kind == 0:
            pos += left
            continue
        chunk += data[pos + _HEADER:pos + _HEADER + length]
        pos += _HEADER + length
        if kind in (1, 4):  # FULL, LAST
            record = pb.Record()
            record.ParseFromString(chunk)
            chunk = b""
            yield record


def read_run(path: Path) -> dict[str, Any]:
    """``{"config": {...}, "history": [{...}, ...], "files": [...], "project": ...}``."""
    out: dict[str, Any] = {"config": {}, "history": [], "files": [], "project": None}
    for record in records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            out["project"] = record.run.project
            out["config"].update({i.key: json.loads(i.value_json)
                                  for i in record.run.config.update})
        elif kind == "config":
            out["config"].update({i.key: json.loads(i.value_json) for i in record.config.update})
        elif kind == "history":
            out["history"].append({_key(i): json.loads(i.value_json)
                                   for i in record.history.item})
        elif kind == "files":
            out["files"] += [f.path for f in record.files.files]
    return out


def _key(item: Any) -> str:
    """A history item's name: ``key``, or its ``nested_key`` parts joined by "/" (how W&B
    records names holding a "/")."""
    return str(item.key) or "/".join(item.nested_key)
