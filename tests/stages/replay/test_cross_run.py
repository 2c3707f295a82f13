"""Cross-run replay (SAPO-style): groups of other runs from another store, chosen by a
typed row filter (``match``), with lineage (parent_id, replay_source) kept through a commit; config errors name the
field and value."""

from __future__ import annotations

import pyarrow.compute as pc
import pytest
from pydantic import ValidationError

from gfcr.core.rollout import col, prompt_id
from gfcr.core.row_filter import RowFilter
from gfcr.core.stage import StepContext
from stages import CrossRunReplay
from store import RolloutStore
from tests.resources.replay import Pool, attempts

MIX, FLAT = [1.0, 0.0, 1.0, 0.0], [0.0] * 4


@pytest.fixture
def source(tmp_path):
    """Store with run "src" (a mixed and a flat group) and a row of run "me" itself."""
    path = tmp_path / "source"
    with RolloutStore.open(path) as s:
        t = attempts(0, {"qa": MIX, "qb": FLAT}, run_id="src")
        kept = pc.invert(pc.equal(t.column(col.PROMPT), "qb"))
        t = t.set_column(t.schema.get_field_index(col.KEPT), col.KEPT, kept)
        s.commit_step("src", 0, t, policy_version=7, metrics={})
        s.commit_step("me", 0, attempts(0, {"qc": MIX}, run_id="me"), policy_version=0, metrics={})
    return path


def _ctx(step=0):
    return StepContext(run_id="me", step=step, seed=0, policy_version=0, task=Pool([]))


def test_replays_whole_groups_of_other_runs_with_lineage(source, tmp_path):
    batch = attempts(0, {"fresh": MIX}, run_id="me")
    out = CrossRunReplay(source=str(source), groups=5).augment(_ctx(), batch)
    replayed = out.filter(pc.greater(out.column(col.REPLAY_COUNT), 0)).to_pylist()
    assert [r[col.PARENT_ID] for r in replayed] == [f"src/0/qa/{i}" for i in range(4)]
    assert {r["replay_source"] for r in replayed} == {f"{source}#src"}
    assert all(r[col.RUN_ID] == "me" and r[col.POLICY_VERSION_START] == 0 for r in replayed)
    assert out.filter(pc.equal(out.column(col.REPLAY_COUNT), 0)).column("replay_source").null_count == 4
    with RolloutStore.open(tmp_path / "mine") as mine:  # the extra column survives a commit
        mine.commit_step("me", 0, out, policy_version=0, metrics={})
        stored = mine.sql("SELECT count(*) AS n FROM rollouts WHERE replay_source IS NOT NULL")
    assert stored.column("n")[0].as_py() == 4


def test_match_selects_groups_and_own_run_is_never_taken(source):
    flat = CrossRunReplay(source=str(source), match={"kept": False}).augment(_ctx(), attempts(0, {"x": MIX}, run_id="me"))
    assert set(flat.column(col.PROMPT).to_pylist()) == {"x", "qb"}
    mine = CrossRunReplay(source=str(source), match={"prompt_ids": [prompt_id("add", "qc")]}).augment(_ctx(), attempts(0, {"x": MIX}, run_id="me"))
    assert mine.num_rows == 4  # qc belongs to run "me": that is RolloutReplay's job


def test_choice_is_seeded_and_bounded(source):
    stage = CrossRunReplay(source=str(source), match=RowFilter(), groups=1)
    a = stage.augment(_ctx(1), attempts(1, {"x": MIX}, run_id="me"))
    b = stage.augment(_ctx(1), attempts(1, {"x": MIX}, run_id="me"))
    assert a.num_rows == b.num_rows == 8 and a.column(col.PARENT_ID).equals(b.column(col.PARENT_ID))


def test_errors_name_stage_field_and_value(tmp_path, source):
    with pytest.raises(ValidationError, match="where"):
        CrossRunReplay(source=str(source), where="kept; SELECT 1")
    with pytest.raises(ValueError, match=r"'source' = '.*nowhere'"):
        CrossRunReplay(source=str(tmp_path / "nowhere")).augment(_ctx(), attempts(0, {"x": MIX}, run_id="me"))
    with pytest.raises(ValidationError, match=r"kept\n.*valid boolean"):
        CrossRunReplay(source=str(source), match={"kept": "yes"})
    with pytest.raises(ValidationError, match=r"colour\n.*Extra inputs"):
        CrossRunReplay(source=str(source), match={"colour": "red"})


def test_a_stored_spec_with_a_shipped_where_still_loads_as_its_filter(source):
    """Specs stored before ``match`` gave SQL ``where``; the shipped ones become filters
    and select what they selected (a run that used one can be resumed)."""
    old = CrossRunReplay(source=str(source), where="kept AND reward > 0")
    assert old.match == RowFilter(kept=True, reward_above=0.0)
    assert CrossRunReplay(source=str(source), where="NOT  KEPT").match == RowFilter(kept=False)
    out = old.augment(_ctx(), attempts(0, {"x": MIX}, run_id="me"))
    assert set(out.column(col.PROMPT).to_pylist()) == {"x", "qa"}  # qb: dropped, and never rewarded
    with pytest.raises(ValidationError, match="'no_such_column > 1' is a SQL condition"):
        CrossRunReplay(source=str(source), where="no_such_column > 1")
