"""ListOrder: partial credit for a list answer by the share of its pairs in the right order."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from stages import ListOrder, ReasoningGym, Verify
from tests.resources.rollouts import context, rollouts

NUMBERS = {"datasets": [{"name": "number_sorting", "weight": 0.5,
                         "config": {"min_numbers": 3, "max_numbers": 5, "min_decimals": 0,
                                    "max_decimals": 0}},
                        {"name": "word_sorting", "weight": 0.5,
                         "config": {"min_words": 4, "max_words": 6}}]}


def _score(completion, answer, meta=None, credit=0.5):
    return ListOrder(credit=credit).scorer(context())(completion, answer, meta)


def test_the_exact_list_is_worth_one_and_numbers_compare_as_numbers():
    ref = "['-49.0', '12.0', '66.0']"
    assert _score(ref, ref) == 1.0
    assert _score(" [-49, 12, 66] ", ref) == 1.0
    assert _score("apple, banana, cherry", "apple, banana, cherry") == 1.0


def test_a_wrong_order_earns_credit_times_the_share_of_pairs_in_order():
    ref = "['1', '2', '3', '4']"
    assert _score("['2', '1', '3', '4']", ref) == pytest.approx(0.5 * 5 / 6)
    assert _score("['4', '3', '2', '1']", ref) == 0.0  # every pair reversed
    assert _score("['2', '1', '3', '4']", ref, credit=0.2) == pytest.approx(0.2 * 5 / 6)
    assert _score("b, a, c", "a, b, c") == pytest.approx(0.5 * 2 / 3)
    # a repeated item is matched in order of appearance
    assert _score("['2', '1', '1']", "['1', '1', '2']") == pytest.approx(0.5 * 1 / 3)


def test_other_items_or_no_list_earn_nothing():
    ref = "['1', '2', '3']"
    assert _score("['1', '2']", ref) == 0.0            # one missing
    assert _score("['1', '2', '3', '3']", ref) == 0.0  # one extra
    assert _score("['1', '2', '4']", ref) == 0.0       # another item
    assert _score("the sorted list is 1 2 3", ref) == 0.0
    assert _score("['1', '2', '3'", ref) == 0.0        # broken JSON


def test_the_reference_comes_from_answer_or_meta_and_must_be_a_list():
    meta = json.dumps({"answer": "['1', '2']"})
    assert _score("['1', '2']", None, meta) == 1.0
    with pytest.raises(ValueError, match="no reference answer"):
        _score("['1', '2']", None, json.dumps({"question": "sort"}))
    with pytest.raises(ValueError, match="reference 'forty-two' is not a list"):
        _score("['1', '2']", "forty-two")
    with pytest.raises(ValidationError):
        ListOrder(credit=1.0)  # a wrong order may not earn as much as the right one


def test_on_reasoning_gym_sorting_rows_it_agrees_with_the_task_scorer_on_right_answers():
    task = ReasoningGym(dataset="composite", config=NUMBERS, train_size=12, heldout_size=2)
    rows = task.train_prompts().to_pylist()
    score = ListOrder().scorer(context(task=task))
    for row in rows:
        right = row["answer"]
        assert score(right, row["answer"], row["meta"]) == 1.0
        assert task.score(right, row["answer"], row["meta"]) == 1.0
        items = json.loads(right.replace("'", '"')) if right.startswith("[") else \
            right.split(", ")
        wrong = list(reversed(items))
        text = str(wrong) if right.startswith("[") else ", ".join(wrong)
        if wrong != items:
            assert score(text, row["answer"], row["meta"]) < 0.5
            assert task.score(text, row["answer"], row["meta"]) < 1.0


def test_verify_writes_list_order_rewards_in_process():
    verify = Verify(scorer=ListOrder(), on_error="zero")
    table = rollouts(["g"] * 4, completion=["['1', '2', '3']", "['2', '1', '3']", "no list",
                                            "['1']"],
                     answer=["['1', '2', '3']"] * 3 + ["forty-two"])
    out = verify.apply(context(), table).table
    assert out.column("reward").to_pylist() == [1.0, pytest.approx(1 / 3), 0.0, 0.0]
    assert "not a list" in out.column("score_error").to_pylist()[3]  # recorded, run goes on
    assert not verify.in_worker()
    assert Verify.model_validate(verify.model_dump()) == verify  # round-trips by its type
