"""LakeHistory.rows: each RowFilter field selects what its docstring says (checked against a
plain-Python reading of every row), values are bound, not spliced into the SQL, and the
projection, order, limit and time travel hold."""

from __future__ import annotations

from typing import Any, Callable

import pyarrow as pa
import pytest

from gfcr.core.rollout import col
from gfcr.core.row_filter import ATTEMPTS, RowFilter
from store import _rows
from store.history import LakeHistory

from .conftest import QA, QB, commit_history, make_rollouts

Row = dict[str, Any]

CASES: list[tuple[RowFilter, Callable[[Row], bool]]] = [
    (RowFilter(run_ids=("o'x",)), lambda r: r["run_id"] == "o'x"),
    (RowFilter(run_ids=("r", "o'x")), lambda r: True),
    (RowFilter(exclude_runs=("r",)), lambda r: r["run_id"] != "r"),
    (RowFilter(step_min=1), lambda r: r["step"] >= 1),
    (RowFilter(step_max=0), lambda r: r["step"] <= 0),
    (RowFilter(step_min=1, step_max=1), lambda r: r["step"] == 1),
    (RowFilter(status=("partial", "pruned")), lambda r: r["status"] in ("partial", "pruned")),
    (RowFilter(kept=True), lambda r: r["kept"]),
    (RowFilter(kept=False), lambda r: not r["kept"]),
    (RowFilter(scored=True), lambda r: r["reward"] is not None),
    (RowFilter(scored=False), lambda r: r["reward"] is None),
    (RowFilter(replayed=True), lambda r: r["replay_count"] > 0),
    (RowFilter(replayed=False), lambda r: r["replay_count"] == 0),
    (RowFilter(consumed=True), lambda r: r["consumed_at_step"] is not None),
    (RowFilter(consumed=False), lambda r: r["consumed_at_step"] is None),
    (RowFilter(reward_above=0.0), lambda r: r["reward"] is not None and r["reward"] > 0),
    (RowFilter(prompt_ids=(QB,)), lambda r: r["prompt_id"] == QB),
    (RowFilter(prompt_ids=(QA, QB)), lambda r: r["prompt_id"] in (QA, QB)),
    (RowFilter(tasks=("mul",)), lambda r: r["task"] == "mul"),
    (RowFilter(parent_ids=("r/0/0",)), lambda r: r["parent_id"] == "r/0/0"),
    (RowFilter(groups=(("r", "gA1"), ("o'x", "o'x/0/g0"))),
     lambda r: (r["run_id"], r["group_id"]) in {("r", "gA1"), ("o'x", "o'x/0/g0")}),
    (ATTEMPTS, lambda r: r["status"] == "complete" and r["reward"] is not None and r["replay_count"] == 0),
    (RowFilter.attempts(kept=True, step_min=1),
     lambda r: (r["status"] == "complete" and r["reward"] is not None and r["replay_count"] == 0
                and r["kept"] and r["step"] >= 1)),
]


@pytest.fixture
def filled(store):
    """Run "r" (store.conftest.commit_history) and a run "o'x" of task "mul" (a quote in
    its id: values must be bound, not spliced into SQL text)."""
    commit_history(store)
    other = make_rollouts(4, run_id="o'x", step=0, task=["mul"] * 4, rewards=[1.0, None, 0.5, 0.0])
    store.commit_step("o'x", 0, other, policy_version=0, metrics={})
    return store


def _ids(table: pa.Table) -> list[str]:
    return sorted(table.column(col.ROLLOUT_ID).to_pylist())


@pytest.mark.parametrize("flt, keep", CASES, ids=[repr(c[0].model_dump(exclude_defaults=True))
                                                  for c in CASES])
def test_each_field_selects_the_rows_it_names(filled, flt, keep):
    every = LakeHistory(filled).rows().to_pylist()
    assert len(every) == 17
    want = sorted(r[col.ROLLOUT_ID] for r in every if keep(r))
    assert want, "each case selects some rows"
    assert _ids(LakeHistory(filled).rows(flt)) == want


def test_the_history_run_scopes_rows_unless_the_filter_names_runs(filled):
    mine = LakeHistory(filled, run_id="r")
    assert set(mine.rows().column(col.RUN_ID).to_pylist()) == {"r"}
    assert set(mine.rows(RowFilter(run_ids=("o'x",))).column(col.RUN_ID).to_pylist()) == {"o'x"}


def test_projection_order_and_limit(filled):
    h = LakeHistory(filled, run_id="r")
    out = h.rows(ATTEMPTS, columns=[col.STEP, col.ROLLOUT_ID],
                 order_by=((col.STEP, "descending"), (col.ROLLOUT_ID, "ascending")), limit=3)
    assert out.column_names == [col.STEP, col.ROLLOUT_ID]
    assert out.to_pylist() == [{"step": 1, "rollout_id": "r/1/0"}, {"step": 1, "rollout_id": "r/1/3"},
                               {"step": 1, "rollout_id": "r/1/4"}]
    assert h.rows(limit=0).num_rows == 0


def test_rows_as_of_a_step_see_that_snapshot(filled):
    at0 = LakeHistory(filled, run_id="r", as_of_step=0)
    assert set(at0.rows().column(col.STEP).to_pylist()) == {0}
    assert LakeHistory(filled, run_id="r").rows(RowFilter(step_max=0)).equals(at0.rows())


def test_bad_reads_name_what_is_wrong(filled):
    h = LakeHistory(filled)
    with pytest.raises(ValueError, match=r"no column\(s\) \['nope'\]"):
        h.rows(columns=[col.STEP, "nope"])
    with pytest.raises(ValueError, match=r"no column\(s\) \['nope'\]"):
        h.rows(order_by=(("nope", "ascending"),))
    with pytest.raises(ValueError, match="direction 'up' of column 'step'"):
        h.rows(order_by=((col.STEP, "up"),))
    with pytest.raises(ValueError, match="limit must be an integer >= 0, got -1"):
        h.rows(limit=-1)
    with pytest.raises(ValueError, match="columns is empty"):
        h.rows(columns=[])
    with pytest.raises(TypeError, match="takes no SQL conditions"):
        h.rows("kept AND reward > 0")  # type: ignore[arg-type]


def test_values_are_bound_parameters_not_sql_text():
    sql, params = _rows.query("t", RowFilter(run_ids=("a'; DROP TABLE t; --",), step_min=27,
                                             prompt_ids=("prompt-one", "prompt-two"), reward_above=0.625),
                              run_id=None, have=(), columns=None, order_by=(), limit=None)
    assert not any(v in sql for v in ("DROP", "prompt-", "27", "0.625")), sql
    assert sorted(params.values(), key=repr) == sorted(
        ["a'; DROP TABLE t; --", ["prompt-one", "prompt-two"], 27, 0.625], key=repr)
