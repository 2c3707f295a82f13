"""RolloutStore: round trip, exactly-once commits, schema evolution, bad input, views."""

from __future__ import annotations

import math
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from gfcr.core.rollout import ROLLOUT_SCHEMA, SchemaError, col, conform
from store import CommitResult, ReadOnlyError, RolloutStore, StoreError
from store._commit import STAGE_MIN_ROWS

from .conftest import QA, QB, commit_history, make_rollouts

RUN = dict(pipeline="default", spec_yaml="stages: []\n", spec_hash="abc123", code_version="v0")


def _everything(store: RolloutStore) -> dict[str, list]:
    """All rows of all tables, to check that a failed call changed nothing."""
    return {t: store.sql(f"SELECT * FROM {t} ORDER BY ALL").to_pylist() for t in ("rollouts", "steps", "runs")}


def _sorted(table: pa.Table) -> pa.Table:
    return table.sort_by(col.ROLLOUT_ID)


def _derived(table: pa.Table) -> pa.Table:
    """``table`` with the turns conform derives (what the store keeps of it)."""
    i = table.schema.get_field_index(col.TURNS)
    return table.set_column(i, table.schema.field(i), conform(table).column(col.TURNS))


def test_round_trip_keeps_every_column_and_type(store):
    table = make_rollouts(8, run_id="r", step=0, rewards=[1.0, 0.0, None, 0.5, 1.0, 0.0, 0.0, 1.0],
                          parent_id=[None, "r/x/1"] + [None] * 6,
                          completion=["ünïcode ✓", ""] + ["c"] * 6)
    result = store.commit_step("r", 0, table, policy_version=3, metrics={"loss": 0.25, "kl": 0.0})
    assert result == CommitResult(True, 8, result.snapshot, result.message)
    assert isinstance(result.snapshot, int)
    back = store.read_rollouts()
    assert back.schema == ROLLOUT_SCHEMA
    assert _sorted(back).equals(_sorted(_derived(table)))  # turns derived, the rest as given
    assert back.column(col.TURNS).null_count == 0
    raw = store.sql("SELECT rewards, prompt_ids, logprobs FROM rollouts WHERE rollout_id = 'r/0/0'").to_pylist()[0]
    assert raw == {"rewards": [("correct", 1.0), ("format", 1.0)], "prompt_ids": [1, 2, 3], "logprobs": [-0.5, -0.25, -0.125]}
    steps = store.sql("SELECT * FROM steps").to_pylist()
    assert len(steps) == 1
    assert steps[0]["policy_version"] == 3 and steps[0]["n_rollouts"] == 8 and steps[0]["n_kept"] == 8
    assert dict(steps[0]["metrics"]) == {"loss": 0.25, "kl": 0.0}
    assert store.last_step("r") == 0 and store.last_step("other") is None


def test_recommit_is_a_noop_that_says_so(store):
    table = make_rollouts(4, run_id="r", step=0)
    first = store.commit_step("r", 0, table, policy_version=0, metrics={})
    before = _everything(store)
    n_snapshots = store.snapshots().num_rows
    again = store.commit_step("r", 0, make_rollouts(6, run_id="r", step=0), policy_version=0, metrics={})
    assert not again.committed and again.rows == 0
    assert "already committed" in again.message
    assert again.snapshot == first.snapshot
    assert _everything(store) == before
    assert store.snapshots().num_rows == n_snapshots


def test_runs_start_resume_finish(store):
    assert store.start_run("r", **RUN) is True
    assert store.start_run("r", **RUN) is False
    store.finish_run("r", "failed")
    assert store.start_run("r", **RUN) is False  # a resume: running again
    assert store.sql("SELECT status, finished_at FROM runs").to_pylist() == [{"status": "running", "finished_at": None}]
    store.finish_run("r", "finished")
    run = store.sql("SELECT * FROM runs").to_pylist()[0]
    assert run["status"] == "finished" and run["finished_at"] is not None
    assert run["spec_hash"] == "abc123" and run["store"] == store.uri
    with pytest.raises(StoreError, match="no run 'nope'"):
        store.finish_run("nope", "finished")


def test_schema_evolution_adds_nullable_columns(store):
    store.commit_step("r", 0, make_rollouts(3, run_id="r", step=0), policy_version=0, metrics={})
    with_extra = make_rollouts(2, run_id="r", step=1, difficulty=[0.5, 0.75], judge=["ok", None])
    store.commit_step("r", 1, with_extra, policy_version=1, metrics={})
    store.commit_step("r", 2, make_rollouts(2, run_id="r", step=2), policy_version=2, metrics={})
    rows = store.sql("SELECT step, difficulty, judge FROM rollouts ORDER BY step, rollout_id").to_pylist()
    assert [r["difficulty"] for r in rows] == [None, None, None, 0.5, 0.75, None, None]
    assert [r["judge"] for r in rows] == [None, None, None, "ok", None, None, None]
    back = store.read_rollouts("step = 1")
    assert back.schema.names == ROLLOUT_SCHEMA.names + ["difficulty", "judge"]
    before = _everything(store)
    clash = make_rollouts(1, run_id="r", step=3, difficulty=["hard"])
    with pytest.raises(SchemaError, match="'difficulty' has type VARCHAR, the store has DOUBLE"):
        store.commit_step("r", 3, clash, policy_version=3, metrics={})
    assert _everything(store) == before


def _bad_tables():
    good = make_rollouts(4, run_id="r", step=1)
    nan = make_rollouts(4, run_id="r", step=1, rewards=[1.0, math.nan, 0.0, math.inf])
    inf_map = make_rollouts(2, run_id="r", step=1, rewards=[1.0, 0.0])
    inf_map = inf_map.set_column(
        ROLLOUT_SCHEMA.get_field_index(col.REWARDS), col.REWARDS,
        pa.array([[("correct", 1.0)], [("correct", -math.inf)]], ROLLOUT_SCHEMA.field(col.REWARDS).type))
    return [
        (good.drop_columns([col.PROMPT_ID]), SchemaError, "missing column 'prompt_id'"),
        (good.set_column(good.schema.get_field_index(col.REWARD), col.REWARD, pa.array(["high"] * 4)),
         SchemaError, "column 'reward' has type string, expected double"),
        (good.set_column(good.schema.get_field_index(col.KEPT), col.KEPT, pa.array([True, None, True, True])),
         SchemaError, "column 'kept' has 1 null value"),
        (nan, ValueError, "column 'reward' has 2 NaN or infinite value"),
        (inf_map, ValueError, "column 'rewards' has 1 NaN or infinite value"),
        (make_rollouts(4, run_id="other", step=1), ValueError, "column 'run_id' has 4 row"),
        (make_rollouts(4, run_id="r", step=2), ValueError, "column 'step' has 4 row"),
        (pa.concat_tables([good, good]), ValueError, "column 'rollout_id' has 4 duplicate"),
    ]


@pytest.mark.parametrize("table, error, text", _bad_tables())
def test_bad_rollouts_are_refused_and_change_nothing(store, table, error, text):
    store.commit_step("r", 0, make_rollouts(4, run_id="r", step=0), policy_version=0, metrics={})
    before = _everything(store)
    with pytest.raises(error, match=text):
        store.commit_step("r", 1, table, policy_version=1, metrics={})
    assert _everything(store) == before
    assert store.last_step("r") == 0


def test_bad_metrics_are_refused(store):
    with pytest.raises(ValueError, match="metric 'loss' has value 'low'"):
        store.commit_step("r", 0, make_rollouts(2, run_id="r"), policy_version=0, metrics={"loss": "low"})
    assert store.last_step("r") is None


def test_paths_that_are_not_stores(tmp_path):
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("x")
    with pytest.raises(StoreError, match=r"notes'.* exists but is not a gfcr store"):
        RolloutStore.open(tmp_path / "notes")
    with pytest.raises(StoreError, match=r"is a file, not a store folder"):
        RolloutStore.open(tmp_path / "notes" / "todo.txt")
    with pytest.raises(StoreError, match=r"no store at .*missing'.*create=False"):
        RolloutStore.open(tmp_path / "missing", create=False)
    with pytest.raises(StoreError, match=r"no store at .*missing'.*read-only"):
        RolloutStore.open(tmp_path / "missing", read_only=True)
    assert not (tmp_path / "missing").exists()
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "catalog.sqlite").write_bytes(b"not a database at all" * 100)
    with pytest.raises(StoreError, match=r"junk/catalog.sqlite' is not a SQLite database"):
        RolloutStore.open(tmp_path / "junk")
    with pytest.raises(StoreError, match="needs data_path="):
        RolloutStore.open("postgresql://postgres@127.0.0.1/test")
    with pytest.raises(StoreError, match="unsupported scheme"):
        RolloutStore.open("s3://bucket/store")


@pytest.mark.parametrize("query, kind", [
    ("INSERT INTO rollouts SELECT * FROM rollouts", "INSERT"),
    ("UPDATE steps SET n_kept = 0", "UPDATE"),
    ("DELETE FROM runs", "DELETE"),
    ("DROP TABLE rollouts", "DROP"),
    ("CREATE TABLE x AS SELECT 1", "CREATE"),
    ("ALTER TABLE steps ADD COLUMN x INT", "ALTER"),
    ("ATTACH 'other.db' AS other", "ATTACH"),
    ("COPY rollouts TO 'out.parquet'", "COPY"),
    ("CALL ducklake_merge_adjacent_files('lake')", "CALL"),
    ("SELECT 1; DELETE FROM steps", "DELETE"),
    ("EXPLAIN ANALYZE DELETE FROM steps", "EXPLAIN DELETE"),
])
def test_sql_refuses_writes(store, query, kind):
    store.commit_step("r", 0, make_rollouts(4, run_id="r"), policy_version=0, metrics={})
    before = _everything(store)
    with pytest.raises(ReadOnlyError, match=f"read-only through this path: refused {kind} statement"):
        store.sql(query)
    assert _everything(store) == before


def test_sql_reads_and_table_functions_cannot_write(store):
    for step in range(3):
        store.commit_step("r", step, make_rollouts(20, run_id="r", step=step), policy_version=step, metrics={})
    assert store.sql("SELECT count(*) AS n FROM rollouts").to_pylist() == [{"n": 60}]
    assert store.sql("SELECT count(*) AS n FROM rollouts WHERE step = ?", [1]).to_pylist() == [{"n": 20}]
    assert store.sql("EXPLAIN SELECT * FROM steps").num_rows >= 1
    listing = "SELECT count(*) AS n FROM ducklake_list_files('lake', 'rollouts')"
    files = store.connection().execute(listing).fetchall()
    with pytest.raises(ReadOnlyError, match="read-only through this path: refused function.*"
                                            "ducklake_merge_adjacent_files"):
        store.sql("SELECT * FROM ducklake_merge_adjacent_files('lake')")
    assert store.connection().execute(listing).fetchall() == files


def test_read_only_store_reads_and_refuses_writes(tmp_path):
    path = tmp_path / "s"
    with RolloutStore.open(path) as writer:
        writer.commit_step("r", 0, make_rollouts(4, run_id="r"), policy_version=0, metrics={})
        with RolloutStore.open(path, read_only=True) as reader:
            assert reader.last_step("r") == 0
            writer.commit_step("r", 1, make_rollouts(4, run_id="r", step=1), policy_version=1, metrics={})
            assert reader.last_step("r") == 1
            with pytest.raises(ReadOnlyError, match="open read-only; commit_step"):
                reader.commit_step("r", 2, make_rollouts(4, run_id="r", step=2), policy_version=2, metrics={})
            with pytest.raises(ReadOnlyError, match="open read-only; start_run"):
                reader.start_run("x", **RUN)


# -- views, golden numbers on a hand-built history --------------------------------------

def test_group_stats_golden(store):
    commit_history(store)
    rows = store.sql("SELECT * FROM group_stats ORDER BY step, group_id").to_pylist()
    assert [(r["group_id"], r["size"], r["n_kept"]) for r in rows] == [
        ("r/0/g0", 4, 3), ("r/0/g1", 4, 4), ("gA1", 3, 3), ("gB1", 2, 2)]
    assert [r["prompt_id"] for r in rows] == [QA, QB, QA, QB]
    assert [r["pass_rate"] for r in rows] == pytest.approx([0.75, 0.0, 1.0, 0.5])
    assert [r["reward_mean"] for r in rows] == pytest.approx([0.75, 0.0, 1.0, 0.5])
    assert [r["reward_std"] for r in rows] == pytest.approx([math.sqrt(0.1875), 0.0, 0.0, 0.5])


def test_prompt_history_golden(store):
    commit_history(store)
    rows = {r["prompt_id"]: r for r in store.sql("SELECT * FROM prompt_history").to_pylist()}
    a, b = rows[QA], rows[QB]
    # qA: 4 attempts at step 0 (3 successes) + 1 at step 1; the pruned and replayed rows don't count.
    assert (a["task"], a["attempts"], a["successes"], a["last_step"]) == ("add", 5, 4, 1)
    assert a["posterior_mean"] == pytest.approx(5 / 7)
    assert a["posterior_var"] == pytest.approx(5 * 2 / (7 ** 2 * 8))
    w = 0.5 ** (1 / 8)
    assert a["ew_pass_rate"] == pytest.approx((1 + 3 * w) / (1 + 4 * w))
    # qB: 3 attempts at step 0 (the partial doesn't count) + 2 at step 1, one success.
    assert (b["attempts"], b["successes"], b["last_step"]) == (5, 1, 1)
    assert b["posterior_mean"] == pytest.approx(2 / 7)
    assert b["posterior_var"] == pytest.approx(2 * 5 / (7 ** 2 * 8))
    assert b["ew_pass_rate"] == pytest.approx(1 / (2 + 3 * w))


def test_step_metrics_and_lineage(store):
    commit_history(store)
    steps = store.sql("SELECT * FROM step_metrics ORDER BY step").to_pylist()
    assert [(s["step"], s["policy_version"], s["n_rollouts"], s["n_kept"]) for s in steps] == [(0, 0, 8, 7), (1, 1, 5, 5)]
    assert dict(steps[1]["metrics"]) == {"loss": 0.5, "kl": 0.01}
    lineage = store.sql("SELECT * FROM lineage WHERE rollout_id IN ('r/0/3', 'r/1/2') ORDER BY rollout_id").to_pylist()
    assert lineage == [
        {"rollout_id": "r/0/3", "parent_id": None, "run_id": "r", "step": 0, "dropped_by": "length_filter",
         "drop_reason": "too long", "consumed_at_step": None, "replay_count": 0, "status": "complete",
         "finish_reason": "stop"},
        {"rollout_id": "r/1/2", "parent_id": "r/0/0", "run_id": "r", "step": 1, "dropped_by": None,
         "drop_reason": None, "consumed_at_step": 1, "replay_count": 1, "status": "complete",
         "finish_reason": "stop"},
    ]
    assert pc.sum(store.sql("SELECT kept::INT AS k FROM rollouts")["k"]).as_py() == 12


def _parquet_files(store: RolloutStore) -> set:
    return set(Path(store.catalog.data_path).rglob("*.parquet"))


def test_large_steps_are_staged_files_with_the_same_semantics(store):
    n = STAGE_MIN_ROWS + 3
    first = store.commit_step("r", 0, make_rollouts(n, run_id="r"), policy_version=0, metrics={})
    assert first.snapshot == store.step_snapshot("r", 0)
    files = _parquet_files(store)
    assert len(files) == 1 and next(iter(files)).name.startswith("gfcr-")
    again = store.commit_step("r", 0, make_rollouts(n, run_id="r"), policy_version=0, metrics={})
    assert not again.committed and _parquet_files(store) == files  # a no-op writes no file
    evolved = make_rollouts(n, run_id="r", step=1, difficulty=[0.5] * n)
    store.commit_step("r", 1, evolved, policy_version=1, metrics={})
    store.commit_step("r", 2, make_rollouts(n, run_id="r", step=2), policy_version=2, metrics={})
    back = store.read_rollouts("step = 1")
    assert _sorted(back).equals(_sorted(_derived(evolved)))
    assert store.sql("SELECT count(difficulty) AS n FROM rollouts").to_pylist() == [{"n": n}]
    files = _parquet_files(store)
    with pytest.raises(SchemaError, match="'difficulty' has type VARCHAR"):
        store.commit_step("r", 3, make_rollouts(n, run_id="r", step=3, difficulty=["x"] * n),
                          policy_version=3, metrics={})
    assert _parquet_files(store) == files  # the staged file of the failed commit is gone
    assert store.last_step("r") == 2
