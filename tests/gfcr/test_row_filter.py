"""RowFilter: typed conditions on stored rows; bad input is refused with an error that
names the field (and lists are taken as tuples, as YAML gives them)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gfcr.core.row_filter import ATTEMPTS, EVERY_ROW, RowFilter


def test_fields_and_shorthands():
    f = RowFilter.model_validate({"run_ids": ["a", "b"], "status": ["complete"], "kept": True,
                                  "groups": [["a", "g1"]], "reward_above": 0})
    assert f.run_ids == ("a", "b") and f.groups == (("a", "g1"),) and f.reward_above == 0.0
    assert ATTEMPTS == RowFilter(status=("complete",), scored=True, replayed=False)
    assert RowFilter.attempts(step_min=3).where(kept=False) == RowFilter(
        status=("complete",), scored=True, replayed=False, step_min=3, kept=False)
    assert EVERY_ROW == RowFilter()
    with pytest.raises(ValidationError, match="frozen"):
        f.kept = False  # type: ignore[misc]


@pytest.mark.parametrize("field, value, message", [
    ("run_ids", "abc", "run_ids must be a sequence of strings, not the string 'abc'"),
    ("exclude_runs", [1], r"exclude_runs\.0\n.*valid string"),
    ("step_min", -1, r"step_min\n.*greater than or equal to 0"),
    ("step_max", "3", r"step_max\n.*valid integer"),
    ("status", ["done"], "status 'done' is not one of complete, partial, pruned"),
    ("kept", 1, r"kept\n.*valid boolean"),
    ("scored", "yes", r"scored\n.*valid boolean"),
    ("replayed", None, None),
    ("consumed", 0, r"consumed\n.*valid boolean"),
    ("reward_above", "0", r"reward_above\n.*valid number"),
    ("prompt_ids", "p", "prompt_ids must be a sequence of strings, not the string 'p'"),
    ("tasks", [None], r"tasks\.0\n.*valid string"),
    ("parent_ids", 5, r"parent_ids\n.*valid tuple"),
    ("groups", [["a"]], r"groups\.0[.0-9]*\n"),  # the pair (pydantic may name its slot)
    ("colour", "red", r"colour\n.*Extra inputs are not permitted"),
])
def test_bad_input_names_the_field(field, value, message):
    if message is None:
        assert getattr(RowFilter(**{field: value}), field) is value  # None: no condition
        return
    with pytest.raises(ValidationError, match=message):
        RowFilter(**{field: value})


def test_an_empty_step_range_is_refused():
    with pytest.raises(ValidationError, match="step_min 4 is after step_max 2"):
        RowFilter(step_min=4, step_max=2)
