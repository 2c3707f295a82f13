"""A store's catalog is never silently replaced, and a store folder is self-contained.

An empty, truncated or foreign ``catalog.sqlite`` is refused with its path and what was
found (issue 12: a 0-byte catalog was replaced by an empty lake and 9,728 rollouts
vanished); a copied or moved store reads its own Parquet files, not the original's.
"""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import sys
from dataclasses import replace

import pytest

from store import RolloutStore, StoreError
from store._duck import connect
from store._location import resolve
from tests.store.conftest import make_rollouts


def _filled(path, rows=300):
    """A store with one staged (Parquet) step and one small step."""
    with RolloutStore.open(path) as s:
        s.start_run("r", pipeline="p", spec_yaml="x", spec_hash="h", code_version="v")
        s.commit_step("r", 0, make_rollouts(rows, run_id="r"), policy_version=0, metrics={})
        s.commit_step("r", 1, make_rollouts(4, run_id="r", step=1), policy_version=1, metrics={})
    return path


def _count(path):
    with RolloutStore.open(path, read_only=True) as s:
        return s.sql("SELECT count(*) AS n FROM rollouts").column("n")[0].as_py()


def _unchanged(path, before: bytes):
    assert (path / "catalog.sqlite").read_bytes() == before


def test_an_empty_catalog_is_refused_not_replaced(tmp_path):
    store = _filled(tmp_path / "s")
    (store / "catalog.sqlite").write_bytes(b"")
    for kwargs in ({}, {"read_only": True}, {"create": False}):
        with pytest.raises(StoreError, match=r"s/catalog.sqlite' is empty \(0 bytes\).*will not "
                                             r"create a new store"):
            RolloutStore.open(store, **kwargs)
    _unchanged(store, b"")


def test_a_truncated_catalog_is_refused(tmp_path):
    store = _filled(tmp_path / "s")
    whole = (store / "catalog.sqlite").read_bytes()
    (store / "catalog.sqlite").write_bytes(whole[:len(whole) // 2])
    with pytest.raises(StoreError, match=r"catalog.sqlite' is truncated \(\d+ bytes; its header "
                                         r"says \d+ pages"):
        RolloutStore.open(store)
    _unchanged(store, whole[:len(whole) // 2])
    (store / "catalog.sqlite").write_bytes(whole[:40])
    with pytest.raises(StoreError, match="shorter than a SQLite header"):
        RolloutStore.open(store)


def test_a_foreign_sqlite_database_is_refused(tmp_path):
    (tmp_path / "s").mkdir()
    db = sqlite3.connect(tmp_path / "s" / "catalog.sqlite")
    db.execute("CREATE TABLE invoices (id INTEGER)")
    db.commit()
    db.close()
    before = (tmp_path / "s" / "catalog.sqlite").read_bytes()
    with pytest.raises(StoreError, match=r"not a DuckLake catalog \(it holds: invoices\)"):
        RolloutStore.open(tmp_path / "s")
    _unchanged(tmp_path / "s", before)


def test_a_foreign_ducklake_is_refused(tmp_path):
    catalog, _ = resolve(tmp_path / "s", data_path=None, read_only=False, create=True)
    con = connect(catalog, read_only=False)
    con.execute("CREATE TABLE lake.orders (id INTEGER)")
    con.close()
    with pytest.raises(StoreError, match=r"DuckLake catalog but not a gfcr store: it holds "
                                         r"table\(s\) \['orders'\]"):
        RolloutStore.open(tmp_path / "s")


def test_a_lost_catalog_with_data_left_is_refused(tmp_path):
    store = _filled(tmp_path / "s")
    (store / "catalog.sqlite").unlink()
    with pytest.raises(StoreError, match=r"has Parquet files under data/ but no 'catalog.sqlite'"):
        RolloutStore.open(store)
    assert not (store / "catalog.sqlite").exists()


def test_the_catalog_records_a_relative_data_path(tmp_path):
    store = _filled(tmp_path / "s")
    db = sqlite3.connect(store / "catalog.sqlite")
    assert db.execute("SELECT value FROM ducklake_metadata WHERE key = 'data_path'").fetchone() == ("data/",)
    assert {r[0] for r in db.execute("SELECT path_is_relative FROM ducklake_data_file")} == {1}
    db.close()


@pytest.mark.parametrize("how", ["copy", "move"])
def test_a_copied_or_moved_store_reads_its_own_files(tmp_path, how):
    original = _filled(tmp_path / "a" / "store")
    other = tmp_path / "b" / "store"
    other.parent.mkdir()
    if how == "copy":
        shutil.copytree(original, other)
        # the original's data files go away: a copy that read them would now fail
        shutil.rmtree(original / "data")
        (original / "data").mkdir()
    else:
        shutil.move(original, other)
    assert _count(other) == 304
    with RolloutStore.open(other) as s:  # and it writes into its own data folder
        s.commit_step("r", 2, make_rollouts(300, run_id="r", step=2), policy_version=2, metrics={})
    assert _count(other) == 604
    assert len(list((other / "data").rglob("*.parquet"))) >= 2
    assert not list((tmp_path / "a").rglob("*.parquet"))


def test_stores_created_together_share_one_catalog(tmp_path):
    """Four processes open (create) one fresh store at once; every one commits a step
    and every step is in the one catalog that won."""
    code = ("import sys; from store import RolloutStore; from tests.store.conftest import "
            "make_rollouts\nwith RolloutStore.open(sys.argv[1]) as s:\n"
            "    s.commit_step('r', int(sys.argv[2]), make_rollouts(4, run_id='r', "
            "step=int(sys.argv[2])), policy_version=0, metrics={})\n")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "s"), str(i)],
                              stderr=subprocess.PIPE, text=True) for i in range(4)]
    errors = [p.communicate(timeout=300)[1] for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, errors
    with RolloutStore.open(tmp_path / "s", read_only=True) as s:
        steps = s.sql("SELECT step FROM steps ORDER BY step").column("step").to_pylist()
    assert steps == [0, 1, 2, 3]
    assert sorted(p.name for p in (tmp_path / "s").iterdir()
                  if not p.name.startswith("catalog.sqlite-")) == ["catalog.sqlite", "data"]


def test_duckdb_attaches_the_store_from_its_folder(tmp_path, monkeypatch):
    """The relative data path is what a DuckDB user attaching the catalog as recorded
    (no DATA_PATH given) gets: the data/ beside it, from the store folder."""
    store = _filled(tmp_path / "s")
    monkeypatch.chdir(store)
    catalog, _ = resolve(store, data_path=None, read_only=True, create=False)
    con = connect(replace(catalog, override_data_path=False), read_only=True)
    try:
        assert con.execute("SELECT count(*) FROM rollouts").fetchone() == (304,)
    finally:
        con.close()


_TRY_WRITE = """
import sqlite3, sys
con = sqlite3.connect(sys.argv[1], timeout=0, isolation_level=None)
try:
    con.execute("BEGIN IMMEDIATE")
except sqlite3.OperationalError as exc:
    print(exc)
else:
    print("took the write lock")
"""


def test_checking_an_open_catalog_keeps_this_processs_locks(tmp_path):
    """Opening a second store object on a catalog this process holds must not drop the
    first one's locks: closing any descriptor of a file releases every POSIX lock the
    process holds on it, so a plain read of the header would let another process write
    the catalog under a live writer ("database disk image is malformed", seen in the
    fault drills)."""
    from store._catalog import problem

    catalog = _filled(tmp_path / "s") / "catalog.sqlite"
    writer = sqlite3.connect(catalog, isolation_level=None)
    writer.execute("BEGIN IMMEDIATE")  # this process now holds the catalog's write lock
    try:
        assert problem(catalog) is None
        other = subprocess.run([sys.executable, "-c", _TRY_WRITE, str(catalog)],
                               capture_output=True, text=True, check=True)
        assert other.stdout.strip() == "database is locked"
    finally:
        writer.execute("ROLLBACK")
        writer.close()
