"""Resample-on-Correct: fewest-error correct rollouts, uniformly chosen incorrect ones."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from stages import ResampleOnCorrect
from stages.filter.roc import FORMAT_ERRORS, extra_chars
from tests.resources.rollouts import context, rollouts


def _group(completions, rewards, **kw):
    return rollouts(["g"] * len(completions), rewards, completion=completions, **kw)


def _apply(stage, table, step=0):
    result = stage.apply(context(step=step), table)
    return result.keep, result.reason, result.table


def test_error_count_is_characters_outside_the_answer():
    assert [extra_chars(c, "42", None) for c in ("42", " 42\n", "42!!", "the 42", "41")] == \
        [0, 0, 2, 3, 2]


def test_keeps_the_cleanest_correct_and_preserves_the_pass_rate():
    completions = ["42!!", "42", "42 x", "1", "2", "3", "4", "5"]
    keep, reason, table = _apply(ResampleOnCorrect(group_size=4), _group(completions, [1, 1, 1, 0, 0, 0, 0, 0]))
    # 3 of 8 correct -> round(4 * 3/8) = 2 correct kept: the two with fewest errors
    assert keep[:3] == [False, True, True]
    assert reason[0] == "roc: correct, more errors"
    assert sum(keep[3:]) == 2  # incorrect: 2 of 5, uniformly
    assert {reason[i] for i in range(3, 8) if not keep[i]} == {"roc: incorrect, down-sampled"}
    assert table.column(FORMAT_ERRORS).to_pylist()[:3] == [2.0, 0.0, 1.0]


def test_a_group_with_both_kinds_keeps_at_least_one_of_each():
    keep, _, _ = _apply(ResampleOnCorrect(group_size=4), _group(["42 x"] + ["1"] * 7, [1] + [0] * 7))
    assert keep[0] and sum(keep) == 4  # round(4/8) = 0 would lose the only correct one
    keep, _, _ = _apply(ResampleOnCorrect(group_size=4), _group(["1"] + ["42"] * 7, [0] + [1] * 7))
    assert keep[0] and sum(keep) == 4


def test_all_correct_keeps_fewest_errors_and_small_groups_are_untouched():
    completions = ["42 abc", "42", "42 a", "42 ab", "42 abcd", "42 abcde"]
    keep, _, _ = _apply(ResampleOnCorrect(group_size=3), _group(completions, [1] * 6))
    assert keep == [False, True, True, True, False, False]
    keep, _, _ = _apply(ResampleOnCorrect(group_size=4), _group(["1", "42", "x"], [0, 1, 0]))
    assert keep == [True, True, True]


def test_error_counts_are_pluggable():
    completions = ["42 ERR ERR", "42 ERR", "a long but clean 42", "0", "0", "0"]
    stage = ResampleOnCorrect(group_size=2, errors="regex:ERR")
    keep, _, _ = _apply(stage, _group(completions, [1, 1, 1, 0, 0, 0]))
    assert keep[:3] == [False, False, True]
    stage = ResampleOnCorrect(group_size=2, errors="tests.resources.errors:tool_errors")
    assert _apply(stage, _group(completions, [1, 1, 1, 0, 0, 0]))[0] == keep
    with pytest.raises(ValidationError, match="not a regular expression"):
        ResampleOnCorrect(group_size=2, errors="regex:(")
    with pytest.raises(ValidationError, match="'extra_chars', 'regex:<pattern>'"):
        ResampleOnCorrect(group_size=2, errors="fewest")


def test_groups_are_separate_and_dropped_or_unscored_rows_do_not_count():
    table = rollouts(["a"] * 4 + ["b"] * 4, [1, 0, 0, None, 1, 1, 0, 0],
                     completion=["42"] * 8, kept=[True, True, False, True] + [True] * 4)
    keep, _, _ = _apply(ResampleOnCorrect(group_size=2), table)
    assert keep[:4] == [True, True, True, True]  # only 2 live scored rows in "a"
    assert sum(keep[4:6]) == 1 and sum(keep[6:8]) == 1  # b: 2 of 4 correct -> 1 + 1


def test_decisions_are_seeded_by_the_step():
    table = _group(["42"] * 2 + [str(i) for i in range(10)], [1, 1] + [0] * 10)
    stage = ResampleOnCorrect(group_size=4)
    assert _apply(stage, table)[0] == _apply(stage, table)[0]
    assert any(_apply(stage, table, step=s)[0] != _apply(stage, table)[0] for s in range(1, 6))
