"""Stashes: where a step's tables live between stage calls, named by a :class:`TableRef`.

A stage task receives and returns a :class:`~gfcr.runner.loop.TableRef` (a key and a row
count), never the table: that is what Prefect sees, hashes and records. The stash turns a
reference into the table. Which stash a run uses depends on where its tasks run:

- :class:`SpillStash` (what :func:`gfcr.execute` uses): tasks run in the flow's own
  process (Prefect calls a task in the flow's thread), so tables stay in memory, at no
  copying cost; the least recently used ones are written to Arrow IPC files once the
  tables held pass a byte budget, so memory stays bounded whatever a step produces. A
  reference stays valid either way, until the run releases the step (``forget``).
- :class:`FileStash`: every table is an Arrow IPC file, for tasks that run in another
  process on the same host (a process pool or a task worker).
- :class:`MemoryStash`: a plain dict, for tests and benchmarks that call the loop directly.

Staging every table through a file cost a default step about 20 ms of CPU and 35 ms of
wall time (profiled, BENCHMARKS.md "Engine"), for nothing while every task ran in the
flow's process.
"""

from __future__ import annotations

import glob
import os
import threading
from collections import OrderedDict
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc

from gfcr.runner.loop import TableRef

SPILL_BUDGET = 1 << 30
"""Bytes of tables a SpillStash keeps in memory before it writes the oldest to files."""


def write_arrow(path: Path, table: pa.Table) -> None:
    """Write ``table`` as an Arrow IPC file at ``path``, atomically (temp file, rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with pa.OSFile(str(tmp), "wb") as sink, ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    os.replace(tmp, path)


def read_arrow(path: Path) -> pa.Table:
    """The table in the Arrow IPC file ``path`` (memory-mapped)."""
    with pa.memory_map(str(path)) as source:
        return ipc.open_file(source).read_all()


class MemoryStash:
    """Tables kept in a dict; for tests and benchmarks that call the loop directly."""

    def __init__(self) -> None:
        self._tables: dict[str, pa.Table] = {}

    def put(self, key: str, table: pa.Table) -> TableRef:
        self._tables[key] = table
        return TableRef(key, table.num_rows)

    def get(self, ref: TableRef) -> pa.Table:
        return self._tables[ref.key]

    def forget(self, prefix: str) -> None:
        """Drop the tables whose key starts with ``prefix`` (a finished step's)."""
        for key in [k for k in self._tables if k.startswith(prefix)]:
            del self._tables[key]


class FileStash:
    """Tables staged as Arrow IPC files under ``root``, for tasks in other processes."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def put(self, key: str, table: pa.Table) -> TableRef:
        write_arrow(self.root / f"{key}.arrow", table)
        return TableRef(key, table.num_rows)

    def get(self, ref: TableRef) -> pa.Table:
        return read_arrow(self.root / f"{ref.key}.arrow")

    def forget(self, prefix: str) -> None:
        """Delete the staged files whose key starts with ``prefix`` (a finished step's)."""
        for path in self.root.glob(f"{glob.escape(prefix)}**/*.arrow"):
            if path.relative_to(self.root).as_posix().startswith(prefix):
                path.unlink(missing_ok=True)


class SpillStash:
    """Tables in memory, least recently used first written to ``root`` past ``budget``
    bytes; see the module docstring. Thread-safe: a step's commit reads its table from
    a background thread while the next step puts its own (see gfcr.launch.run)."""

    def __init__(self, root: Path, budget: int = SPILL_BUDGET) -> None:
        self.root = root
        self.budget = budget
        self._held: OrderedDict[str, tuple[pa.Table, int]] = OrderedDict()  # table, bytes
        self._bytes = 0
        self._spilled: set[str] = set()
        self._lock = threading.Lock()

    def put(self, key: str, table: pa.Table) -> TableRef:
        size = table.get_total_buffer_size()  # O(buffers); Table.nbytes walks the data
        with self._lock:
            self._drop(key)
            self._held[key] = (table, size)
            self._bytes += size
            self._spill()
        return TableRef(key, table.num_rows)

    def get(self, ref: TableRef) -> pa.Table:
        with self._lock:
            held = self._held.get(ref.key)
            if held is not None:
                self._held.move_to_end(ref.key)
                return held[0]
            if ref.key not in self._spilled:
                raise KeyError(f"no staged table {ref.key!r} (released, or never put)")
        return read_arrow(self._path(ref.key))

    def forget(self, prefix: str) -> None:
        """Release every table whose key starts with ``prefix`` (a finished step's)."""
        with self._lock:
            for key in [k for k in (*self._held, *self._spilled) if k.startswith(prefix)]:
                self._drop(key)

    @property
    def held_bytes(self) -> int:
        """Bytes of the tables held in memory (their Arrow buffers; a buffer shared by
        several tables, or only partly used by a slice, counts whole for each, so this
        errs high)."""
        return self._bytes

    def _spill(self) -> None:
        """Write the least recently used tables to files until the rest fit the budget;
        the newest table always stays in memory."""
        while self._bytes > self.budget and len(self._held) > 1:
            key, (table, size) = self._held.popitem(last=False)
            write_arrow(self._path(key), table)
            self._spilled.add(key)
            self._bytes -= size

    def _drop(self, key: str) -> None:
        held = self._held.pop(key, None)
        if held is not None:
            self._bytes -= held[1]
        if key in self._spilled:
            self._spilled.discard(key)
            self._path(key).unlink(missing_ok=True)

    def _path(self, key: str) -> Path:
        return self.root / f"{key}.arrow"
