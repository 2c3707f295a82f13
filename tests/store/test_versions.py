"""The store's schema version: recorded, migrated on open for writing, read as it is when
read-only, and a newer one refused (store._versions); the ``turns`` view over rows of
every version."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from gfcr.core.rollout import col
from store import RolloutStore, StoreError
from store.reads import LakeRunReads
from store._versions import SCHEMA_VERSION
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


def test_an_old_store_is_read_as_it_is_and_migrated_when_opened_for_writing(tmp_path: Path) -> None:
    folder = tmp_path / "v1"
    shutil.copytree(old_store.FIXTURE / "store", folder)
    with RolloutStore.open(folder, read_only=True) as s:
        assert "schema_versions" not in s.sql("SHOW ALL TABLES")["name"].to_pylist()
        assert col.TURNS not in s.sql("SELECT * FROM rollouts LIMIT 0").column_names
        before = _turns(s)
        rows = s.read_rollouts()
    assert rows.column(col.TURNS).null_count == 0  # read with their single-turn form
    assert len(before) == 2 * rows.num_rows and {t[3] for t in before} == {"environment", "policy"}
    with RolloutStore.open(folder) as s:
        assert _versions(s) == ALL
        assert s.sql("SELECT count(*) AS n, count(turns) AS t FROM rollouts").to_pylist() == [
            {"n": rows.num_rows, "t": 0}]  # stored rows are not rewritten
        assert _turns(s) == before
        s.commit_step("new", 0, make_rollouts(2, run_id="new"), policy_version=0, metrics={})
        assert len(_turns(s, "run_id = 'new'")) == 4


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
    with RolloutStore.open(folder) as s:  # made a version 2 store: version 3 undone
        s.record_evaluation("r", 0, "step=0", accuracy=0.25, n_prompts=4, temperature=0.0,
                            max_tokens=8)
        s._transaction(lambda con: [con.execute(f"ALTER TABLE lake.evaluations DROP COLUMN {c}")
                                    for c in _EVAL_COLUMNS] + [
            con.execute("DROP TABLE lake.eval_completions"),
            con.execute("DELETE FROM lake.schema_versions WHERE version = 3")])
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
