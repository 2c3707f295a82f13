"""export (Parquet, JSONL) and compact (fewer files, same data, time travel kept)."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from store import ReadOnlyError, RolloutStore, StoreError
from store.history import LakeHistory
from store.maintenance import compact, export

from .conftest import QA, commit_history, make_rollouts


def test_export_parquet_and_jsonl(store, tmp_path):
    commit_history(store)
    path = export(store, tmp_path / "all.parquet")
    table = pq.read_table(path)
    assert table.num_rows == 13 and table.schema.names[:3] == ["run_id", "step", "rollout_id"]
    lines = export(store, tmp_path / "s1.jsonl", format="jsonl", match={"step": 1}).read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    assert sorted(r["rollout_id"] for r in rows) == [f"r/1/{i}" for i in range(5)]
    first = next(r for r in rows if r["rollout_id"] == "r/1/0")
    assert first["rewards"] == {"correct": 1.0, "format": 1.0} and first["prompt_ids"] == [1, 2, 3]
    stats = export(store, tmp_path / "ph.parquet", table="prompt_history")
    assert pq.read_table(stats).num_rows == 2
    with pytest.raises(ValueError, match="cannot export 'secrets'"):
        export(store, tmp_path / "x.parquet", table="secrets")
    with pytest.raises(ValueError, match="format 'csv'"):
        export(store, tmp_path / "x.csv", format="csv")


def test_export_huggingface_dataset(store, tmp_path):
    import datasets

    commit_history(store)
    path = export(store, tmp_path / "hf", format="hf", match={"kept": True})
    data = datasets.load_from_disk(str(path))
    expected = store.sql("SELECT count(*) AS n FROM rollouts WHERE kept").column("n")[0].as_py()
    assert data.num_rows == expected > 0
    assert {"prompt", "completion", "reward", "completion_ids"} <= set(data.column_names)


def test_compact_merges_files_and_keeps_time_travel(store, tmp_path):
    for step in range(6):
        rows = 4 if step == 2 else 30  # step 2 is inlined in the catalog
        store.commit_step("r", step, make_rollouts(rows, run_id="r", step=step, prompt_id=[QA] * rows),
                          policy_version=step, metrics={})
    pinned = LakeHistory(store, run_id="r", as_of_step=3).prompt_stats()
    everything = store.sql("SELECT * FROM rollouts ORDER BY rollout_id")
    result = compact(store)
    assert result.files_after < result.files_before
    assert store.sql("SELECT * FROM rollouts ORDER BY rollout_id").equals(everything)
    assert LakeHistory(store, run_id="r", as_of_step=3).prompt_stats().equals(pinned)
    store.commit_step("r", 6, make_rollouts(30, run_id="r", step=6), policy_version=6, metrics={})
    assert store.last_step("r") == 6
    with RolloutStore.open(store.uri, read_only=True) as reader:
        with pytest.raises(ReadOnlyError, match="compact needs read_only=False"):
            compact(reader)


def test_export_filter_is_typed_never_spliced_sql(store, tmp_path):
    """Issue 26 item 7: a filter is column = value, converted to the column's type and
    bound; text that was SQL stays a value (or is refused, naming the column)."""
    commit_history(store)
    out = tmp_path / "x.jsonl"
    assert export(store, out, format="jsonl", match={"step": (1, 2), "kept": "true"}).is_file()
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows and all(r["kept"] and 1 <= r["step"] <= 2 for r in rows)
    export(store, out, format="jsonl", match={"run_id": "r' OR '1'='1"})
    assert out.read_text() == ""
    for match, message in [({"step": "1 OR 1=1"}, "cannot filter 'step'"),
                           ({"nosuch": 1}, "no such column"),
                           ({"reward": "inf"}, "finite number"),
                           ({"rewards": "x"}, "takes no equality filter")]:
        with pytest.raises(ValueError, match=message):
            export(store, out, match=match)


def test_compact_refuses_data_files_outside_the_store(tmp_path):
    """Issue 26 item 7: a catalog naming a data file outside the store (edited, copied,
    or added with ducklake_add_data_files) is not followed by compaction."""
    import sqlite3

    root = tmp_path / "store"
    with RolloutStore.open(root) as s:
        s.commit_step("r", 0, make_rollouts(300, run_id="r"), policy_version=0, metrics={})
        s.commit_step("r", 1, make_rollouts(4, run_id="r", step=1), policy_version=1, metrics={})
    staged = next((root / "data").rglob("*.parquet"))
    outside = tmp_path / "elsewhere" / "private.parquet"
    outside.parent.mkdir()
    staged.rename(outside)
    with sqlite3.connect(root / "catalog.sqlite") as db:
        db.execute("UPDATE ducklake_data_file SET path = ?, path_is_relative = 0", [str(outside)])
    before = sorted(p for p in root.rglob("*") if p.is_file() and "sqlite" not in p.name)
    with RolloutStore.open(root) as s:
        with pytest.raises(StoreError, match="outside its data path") as caught:
            compact(s)
    assert str(outside) in str(caught.value)
    assert sorted(p for p in root.rglob("*") if p.is_file() and "sqlite" not in p.name) == before
