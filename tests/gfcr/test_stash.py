"""Stashes: tables stay in memory, spill to Arrow files past a budget, and are released."""

from __future__ import annotations

import threading

import pyarrow as pa
import pytest

from gfcr.transport.stash import FileStash, SpillStash


def _table(n: int, fill: int = 0) -> pa.Table:
    return pa.table({"x": pa.array([fill] * n, pa.int64())})


def test_tables_stay_in_memory_within_the_budget(tmp_path):
    stash = SpillStash(tmp_path / "s")
    t = _table(10)
    ref = stash.put("0/0/group", t)
    assert ref.key == "0/0/group" and ref.rows == 10
    assert stash.get(ref) is t  # the same table: nothing copied or written
    assert not (tmp_path / "s").exists()


def test_the_least_recently_used_tables_spill_to_files_and_read_back(tmp_path):
    one = _table(1000).get_total_buffer_size()
    stash = SpillStash(tmp_path / "s", budget=int(3.5 * one))
    refs = [stash.put(f"0/0/t{i}", _table(1000, fill=i)) for i in range(3)]
    stash.get(refs[0])  # t0 used last: t1 is now the least recently used
    refs.append(stash.put("0/0/t3", _table(1000, fill=3)))
    assert sorted(p.name for p in (tmp_path / "s" / "0" / "0").iterdir()) == ["t1.arrow"]
    assert stash.held_bytes == 3 * one
    for i, ref in enumerate(refs):
        assert stash.get(ref).column("x").to_pylist() == [i] * 1000


def test_the_newest_table_stays_in_memory_even_over_budget(tmp_path):
    stash = SpillStash(tmp_path / "s", budget=1)
    t = _table(100)
    assert stash.get(stash.put("0/0/a", t)) is t


def test_forget_releases_a_steps_tables_in_memory_and_on_disk(tmp_path):
    stash = SpillStash(tmp_path / "s", budget=_table(100).get_total_buffer_size())
    old = [stash.put(f"3/0/t{i}", _table(100)) for i in range(2)]  # 3/0/t0 spills
    keep = stash.put("4/0/t0", _table(100))
    stash.forget("3/")
    for ref in old:
        with pytest.raises(KeyError, match="3/0/t"):
            stash.get(ref)
    assert not any((tmp_path / "s").rglob("*.arrow"))
    assert stash.get(keep).num_rows == 100 and stash.held_bytes == _table(100).get_total_buffer_size()


def test_concurrent_puts_and_gets_keep_every_table(tmp_path):
    stash = SpillStash(tmp_path / "s", budget=3 * _table(50).get_total_buffer_size())
    errors = []

    def work(k: int) -> None:
        try:
            for i in range(20):
                ref = stash.put(f"{k}/0/t{i}", _table(50, fill=i))
                assert stash.get(ref).column("x")[0].as_py() == i
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)
    threads = [threading.Thread(target=work, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_file_stash_round_trips_through_files(tmp_path):
    stash = FileStash(tmp_path / "f")
    ref = stash.put("1/0/verify", _table(7, fill=5))
    assert (tmp_path / "f" / "1" / "0" / "verify.arrow").is_file()
    assert stash.get(ref).equals(_table(7, fill=5))
