"""Turn budgets (TRACE-style, stages.control.turns): per-episode turn caps from the history,
golden values worked by hand."""

import pyarrow as pa
import pytest
from pydantic import ValidationError

from gfcr.core.rollout import PLAN_MAX_TURNS, RECYCLE, RECYCLE_TYPE, col
from stages import TurnBudget
from tests.resources.rollouts import context
from tests.stages.control.test_allocate import History

# posterior means: easy (19 of 20) 20/22, fail (0 of 8) 1/10, new 1/2
HISTORY = History({"easy": (19, 1), "fail": (0, 8)})


def _plan(own=None, recycled=False):
    rec = [{"sample_idx": 0, "parent_id": "x", "prefix_ids": [], "prefix_logprobs": [],
            "policy_version_start": None, "policy_version_end": None, "finish_reason": None}]
    columns = {col.PROMPT_ID: ["easy", "fail", "new"], "n": pa.array([4, 4, 4], pa.int64()),
               RECYCLE: pa.array([None, None, rec if recycled else None], RECYCLE_TYPE)}
    if own is not None:
        columns[PLAN_MAX_TURNS] = pa.array(own, pa.int64())
    return pa.table(columns)


def _caps(stage, plan=None):
    return stage.allocate(context(history=HISTORY), plan or _plan()).column(PLAN_MAX_TURNS).to_pylist()


def test_golden_caps():
    """budget 60 over n = 4 episodes each: caps sum to at most 15.
    informative, weights m(1-m) + 1e-3 = (.0836, .091, .251): the largest scale s with
    floor(s w) summing to <= 15 is just under 47.85 (easy's cap reaching 4), giving
    (3, 4, 8), new capped at max_turns 8.
    hard, weights 1 - m + 1e-3 = (.0919, .901, .501): fail is capped at 8 from s = 8.9,
    new reaches 7 at s = 13.97 (total 16), so s < 13.97: (1, 8, 6).
    uniform: 3 * c <= 15, c = 5."""
    assert _caps(TurnBudget(budget=60, max_turns=8)) == [3, 4, 8]
    assert _caps(TurnBudget(budget=60, max_turns=8, split="hard")) == [1, 8, 6]
    assert _caps(TurnBudget(budget=60, max_turns=8, split="uniform")) == [5, 5, 5]


def test_a_rows_own_cap_bounds_it_and_recycled_rows_are_left_alone():
    assert _caps(TurnBudget(budget=60, max_turns=8, split="uniform"),
                 _plan(own=[2, None, 9])) == [2, 6, 6]
    caps = _caps(TurnBudget(budget=60, max_turns=8, split="uniform"), _plan(recycled=True))
    assert caps[2] is None and caps[:2] == [7, 7]


def test_min_turns_wins_over_the_budget_and_bad_bounds_are_refused():
    assert _caps(TurnBudget(budget=3, min_turns=2, max_turns=8)) == [2, 2, 2]
    with pytest.raises(ValidationError, match="min_turns=5 exceeds max_turns=3"):
        TurnBudget(min_turns=5, max_turns=3)
