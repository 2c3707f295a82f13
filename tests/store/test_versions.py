"""The store's schema version: recorded, migrated on open for writing (version 4 storing
the turns of old rows, safe to kill and run again), read as this version when read-only
(store._compat), and a newer one refused (store._versions); the ``turns`` view over rows
of every version."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from gfcr.core.rollout import col
from gfcr.core.turncols import single_turns
from store import RolloutStore, StoreError
from store.reads import LakeRunReads
from store._versions import MIGRATIONS, SCHEMA_VERSION
from tests.resources import old_store

from .conftest import make_rollouts


ALL = list(range(2, SCHEMA_VERSION + 1))
"""What a store opened for writing records: every migration since version 1, each once."""


def _versions(store: RolloutStore) -> list[int]:
    return store.sql("SELECT version FROM schema_versions ORDER BY version")["version"].to_pylist()


def _turns(store: RolloutStore, where: str = "true") -> list[tuple]:
    rows = store.sql(f"SELECT rollout_id, turn, role, source, n_tokens, logprob_sum FROM turns "
                     f"WHERE {where} ORDER BY rollout_id, turn").to_pylist()
    return [(r["rollout_id"], r["turn"], r["role"], r["source"], r["n_tokens"],
             None if r["logprob_sum"] is None else round(r["logprob_sum"], 4)) for r in rows]


def test_a_new_store_records_this_version_and_its_rows_turns(tmp_path: Path) -> None:
    with RolloutStore.open(tmp_path / "s") as s:
        s.commit_step("r", 0, make_rollouts(2, run_id="r", hint_tokens=[1, 0]),
                      policy_version=0, metrics={})
        assert _versions(s) == ALL
        assert s.sql("SELECT count(turns) AS n FROM rollouts").to_pylist() == [{"n": 2}]
        assert _turns(s) == [
            ("r/0/0", 0, "user", "environment", 3, None),
            ("r/0/0", 1, "assistant", "forced", 1, -0.5),
            ("r/0/0", 2, "assistant", "policy", 2, -0.375),
            ("r/0/1", 0, "user", "environment", 3, None),
            ("r/0/1", 1, "assistant", "policy", 3, -0.875)]
    with RolloutStore.open(tmp_path / "s") as s:  # opened again: nothing to migrate
        assert _versions(s) == ALL


def test_an_old_store_reads_as_this_version_and_is_migrated_when_opened_for_writing(tmp_path: Path) -> None:
    folder = tmp_path / "v1"
    shutil.copytree(old_store.FIXTURE / "store", folder)
    with RolloutStore.open(folder, read_only=True) as s:
        assert _versions(s) == []  # version 1 recorded none; the table reads empty
        assert s.sql("SELECT count(*) AS n FROM lake.rollouts").to_pylist()[0]["n"] > 0
        assert col.TURNS not in s.sql("SELECT * FROM lake.rollouts LIMIT 0").column_names
        before = _turns(s)
        rows = s.read_rollouts()
    assert rows.column(col.TURNS).null_count == 0  # read with their single-turn form
    assert len(before) == 2 * rows.num_rows and {t[3] for t in before} == {"environment", "policy"}
    with RolloutStore.open(folder) as s:
        assert _versions(s) == ALL
        assert s.sql("SELECT count(*) AS n, count(turns) AS t FROM lake.rollouts").to_pylist() == [
            {"n": rows.num_rows, "t": rows.num_rows}]  # version 4 stored them
        assert _turns(s) == before
        assert s.read_rollouts().drop_columns([col.TURNS]).equals(rows.drop_columns([col.TURNS]))
        s.commit_step("new", 0, make_rollouts(2, run_id="new"), policy_version=0, metrics={})
        assert len(_turns(s, "run_id = 'new'")) == 4


@pytest.mark.parametrize("version", ["v1", "v2", "v3"])
def test_version_4_stores_the_turns_the_old_store_read_with_and_changes_nothing_else(
        tmp_path: Path, version: str) -> None:
    """Each fixture (a run begun under version 1, resumed under each later version) read
    read-only, then migrated: every column but ``turns`` as it was, every row's ``turns``
    stored and equal to what was read before, the rows of version 1 equal to
    ``single_turns`` of their flat columns, and the rows as they were kept for time travel."""
    folder = shutil.copytree(old_store.root(version) / "store", tmp_path / version)
    with RolloutStore.open(folder, read_only=True) as s:
        read = s.sql("SELECT * FROM rollouts ORDER BY rollout_id")
        view = s.sql("SELECT * FROM turns ORDER BY rollout_id, turn")
        snapshot = s.snapshots().column("snapshot_id").to_pylist()[-1]
    with RolloutStore.open(folder) as s:
        after = s.sql("SELECT * FROM lake.rollouts ORDER BY rollout_id")
        assert s.sql("SELECT * FROM turns ORDER BY rollout_id, turn").equals(view)
        kept = s.sql(f"SELECT {col.TURNS if version != 'v1' else 'NULL::INT'} AS turns "
                     f"FROM lake.rollouts AT (VERSION => {snapshot}) ORDER BY rollout_id")
    assert after.drop_columns([col.TURNS]).equals(read.drop_columns([col.TURNS]))
    assert after.column(col.TURNS).null_count == 0
    assert after.column(col.TURNS).to_pylist() == read.column(col.TURNS).to_pylist()
    old = pc.is_null(kept.column("turns"))  # the rows stored under version 1
    assert kept.column("turns").null_count == 2 * 16
    flat = after.filter(old)
    derived = single_turns(flat.column(col.PROMPT_IDS), flat.column(col.COMPLETION_IDS),
                           flat.column(col.LOGPROBS), np.zeros(flat.num_rows, np.int64))
    assert flat.column(col.TURNS).to_pylist() == derived.to_pylist()


def test_a_resumed_run_reads_its_steps_from_before_the_migration_as_today_s(tmp_path: Path) -> None:
    """LakeHistory pinned to a step committed under version 1 (before the store was migrated,
    as a resumed run reads it) reads today's rows: turns present, as stored since."""
    from gfcr.core.row_filter import RowFilter
    from store.history import LakeHistory

    folder = shutil.copytree(old_store.FIXTURE / "store", tmp_path / "v1")
    with RolloutStore.open(folder) as s:
        live = s.sql("SELECT rollout_id, turns FROM rollouts WHERE step = 1 ORDER BY rollout_id")
        pinned = LakeHistory(s, run_id=old_store.RUN_ID, as_of_step=1)
        rows = pinned.rows(RowFilter(step_min=1), columns=["rollout_id", col.TURNS],
                           order_by=(("rollout_id", "ascending"),))
        assert pinned.group_stats(step=1).num_rows == 2
    assert rows.to_pylist() == live.to_pylist() and rows.column(col.TURNS).null_count == 0


def test_hinted_rows_read_and_migrate_as_conform_derived_them(tmp_path: Path) -> None:
    """Rows whose turns were not stored (made so here: a version 3 store with null
    ``turns``) read, and are stored by version 4, as ``gfcr.core.rollout`` derives them:
    the forced prefix of ``hint_tokens`` (none, some, more than the completion, null)."""
    folder = tmp_path / "s"
    hints = [0, 1, 2, 5, None, -1]
    with RolloutStore.open(folder) as s:
        s.commit_step("r", 0, make_rollouts(6, run_id="r", hint_tokens=pa.array(hints, pa.int32())),
                      policy_version=0, metrics={})
        conformed = s.sql("SELECT rollout_id, turns FROM lake.rollouts ORDER BY rollout_id")
        s._transaction(lambda con: [con.execute("UPDATE lake.rollouts SET turns = NULL"),
                                    con.execute("DELETE FROM lake.schema_versions WHERE version = 4")])
    with RolloutStore.open(folder, read_only=True) as s:
        assert _versions(s) == ALL[:-1]
        assert s.sql("SELECT rollout_id, turns FROM rollouts ORDER BY rollout_id").equals(conformed)
        assert s.sql("SELECT count(turns) AS n FROM lake.rollouts").to_pylist() == [{"n": 0}]
    with RolloutStore.open(folder) as s:
        assert s.sql("SELECT rollout_id, turns FROM lake.rollouts ORDER BY rollout_id").equals(conformed)
    assert [len(t) for t in conformed.column("turns").to_pylist()] == [2, 3, 3, 3, 2, 2]


def test_a_migration_killed_before_its_commit_leaves_the_store_as_it_was_and_runs_again(
        tmp_path: Path) -> None:
    """The version 4 migration's ``UPDATE`` run in a process killed (SIGKILL) before it
    commits: the store is still version 3 with every row as it was, and opened for
    writing again it is migrated whole; run once more, the migration changes nothing."""
    folder = shutil.copytree(old_store.root("v3") / "store", tmp_path / "v3")
    with RolloutStore.open(folder, read_only=True) as s:
        read = s.sql("SELECT * FROM rollouts ORDER BY rollout_id")
        raw = s.sql("SELECT * FROM lake.rollouts ORDER BY rollout_id")
    killed = subprocess.run([sys.executable, "-c", _KILLED_MIGRATION, str(folder)],
                            capture_output=True, text=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert "migrated, not committed" in killed.stdout
    with RolloutStore.open(folder, read_only=True) as s:
        assert _versions(s) == [2, 3]
        assert s.sql("SELECT * FROM lake.rollouts ORDER BY rollout_id").equals(raw)
    with RolloutStore.open(folder) as s:
        assert _versions(s) == ALL
        migrated = s.sql("SELECT * FROM lake.rollouts ORDER BY rollout_id")
        s._transaction(lambda con: MIGRATIONS[SCHEMA_VERSION](con, "lake"))
        assert s.sql("SELECT * FROM lake.rollouts ORDER BY rollout_id").equals(migrated)
    assert migrated.select(read.column_names).equals(read)  # as read before, in its column order


_KILLED_MIGRATION = """
import os, signal, sys
from store._duck import connect
from store._location import resolve
from store._versions import MIGRATIONS, SCHEMA_VERSION
catalog, _ = resolve(sys.argv[1], data_path=None, read_only=False, create=False)
con = connect(catalog, read_only=False)
con.execute("BEGIN")
MIGRATIONS[SCHEMA_VERSION](con, "lake")
print("migrated, not committed", flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""
"""Runs the last migration's statements in a transaction, then dies before COMMIT."""


def test_a_store_of_a_newer_version_is_refused_and_left_as_it_is(tmp_path: Path) -> None:
    folder = tmp_path / "s"
    with RolloutStore.open(folder) as s:
        s._transaction(lambda con: con.execute(
            f"INSERT INTO lake.schema_versions VALUES ({SCHEMA_VERSION + 1}, now(), 'gfcr 9')"))
    catalog = (folder / "catalog.sqlite").read_bytes()
    for read_only in (True, False):
        with pytest.raises(StoreError) as err:
            RolloutStore.open(folder, read_only=read_only)
        assert (f"rollout schema version {SCHEMA_VERSION + 1}, newer than this gfcr's "
                f"{SCHEMA_VERSION}") in str(err.value)
    assert (folder / "catalog.sqlite").read_bytes() == catalog


def test_a_version_2_store_reads_its_evaluations_and_gains_the_new_ones(tmp_path: Path) -> None:
    """A store of version 2 (an ``evaluations`` table without sets, sampling or
    completions) is read as it is, then migrated: its old row reads as the held-out set,
    and evaluations with completions are written beside it."""
    import pyarrow as pa

    from gfcr.evaluation.columns import COMPLETION_SCHEMA
    from store._versions import _EVAL_COLUMNS

    folder = tmp_path / "v2"
    with RolloutStore.open(folder) as s:  # made a version 2 store: versions 3 and 4 undone
        s.record_evaluation("r", 0, "step=0", accuracy=0.25, n_prompts=4, temperature=0.0,
                            max_tokens=8)
        s._transaction(lambda con: [con.execute(f"ALTER TABLE lake.evaluations DROP COLUMN {c}")
                                    for c in _EVAL_COLUMNS] + [
            con.execute("DROP TABLE lake.eval_completions"),
            con.execute("DELETE FROM lake.schema_versions WHERE version >= 3")])
    with RolloutStore.open(folder, read_only=True) as s:
        assert _versions(s) == [2]
        assert LakeRunReads(s).evaluations("r").to_pylist() == [
            {"step": 0, "accuracy": 0.25, "label": "step=0"}]
    done = pa.Table.from_pylist([
        {"prompt_id": "p", "sample": 0, "temperature": 0.0, "prompt": "1+1=", "answer": "2",
         "completion": "2", "n_tokens": 1, "finish_reason": "stop", "reward": 1.0,
         "correct": True, "error": None}], schema=COMPLETION_SCHEMA)
    with RolloutStore.open(folder) as s:
        assert _versions(s) == ALL
        s.record_evaluation("r", 1, "step=1", accuracy=1.0, n_prompts=1, temperature=0.0,
                            max_tokens=8, eval_set="bench", completions=done,
                            sampled={"samples": 4, "temperature": 1.0, "mean_reward": 0.5,
                                     "pass_at": {1: 0.5, 4: 0.9}})
        rows = s.sql("SELECT label, eval_set, pass_at[4] AS p4 "
                     "FROM evaluations ORDER BY step").to_pylist()
        stored = s.sql("SELECT eval_set, prompt_id, completion, correct FROM eval_completions")
        held = LakeRunReads(s).evaluations("r").to_pylist()
    assert rows == [{"label": "step=0", "eval_set": "heldout", "p4": None},
                    {"label": "step=1", "eval_set": "bench", "p4": 0.9}]
    assert stored.to_pylist() == [{"eval_set": "bench", "prompt_id": "p", "completion": "2",
                                   "correct": True}]
    assert [r["label"] for r in held] == ["step=0"]  # the report's held-out curve
