"""Task components: reasoning-gym prompts and scorer, and JSON-lines files."""

import json

import pytest
from pydantic import ValidationError

from gfcr.core.rollout import PROMPT_SCHEMA, prompt_id
from stages.tasks.reasoning_gym import JsonlTask, ReasoningGym

CONFIG = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2}


def test_prompts_follow_the_schema_and_the_task():
    task = ReasoningGym(config=CONFIG, train_size=50, heldout_size=20, seed=3)
    train = task.train_prompts()
    assert train.schema == PROMPT_SCHEMA and train.num_rows == 50
    row = train.to_pylist()[0]
    assert row["task"] == "chain_sum"
    assert row["prompt"].startswith("State the final answer to the following arithmetic problem: ")
    assert row["prompt_id"] == prompt_id("chain_sum", row["prompt"])
    assert json.loads(row["meta"])["answer"] == row["answer"]
    assert task.train_prompts() is train  # cached per instance


def test_deterministic_and_seeded():
    a = ReasoningGym(config=CONFIG, train_size=40, heldout_size=10, seed=1)
    b = ReasoningGym(config=CONFIG, train_size=40, heldout_size=10, seed=1)
    c = ReasoningGym(config=CONFIG, train_size=40, heldout_size=10, seed=2)
    assert a.train_prompts().equals(b.train_prompts())
    assert a.heldout_prompts().equals(b.heldout_prompts())
    assert not a.train_prompts().equals(c.train_prompts())


def test_heldout_is_distinct_and_disjoint_from_training():
    # the one-digit problems (200 of them) are mostly taken by training: none may leak
    task = ReasoningGym(config=CONFIG, train_size=600, heldout_size=200, seed=0)
    train = task.train_prompts().column("prompt_id").to_pylist()
    held = task.heldout_prompts().column("prompt_id").to_pylist()
    assert len(set(train)) == 600 and len(set(held)) == 200
    assert not set(train) & set(held)


def test_scorer_is_the_datasets_own():
    task = ReasoningGym(config=CONFIG, train_size=5, heldout_size=5)
    row = task.heldout_prompts().to_pylist()[0]
    wrong = str(int(row["answer"]) + 1)
    assert task.score(row["answer"], row["answer"], row["meta"]) == 1.0
    assert task.score(f" {row['answer']}\n", row["answer"], row["meta"]) == 1.0
    assert task.score("x" + wrong + "x" * 9, row["answer"], row["meta"]) < 1.0
    assert task.score("", row["answer"], row["meta"]) == 0.0


def test_config_errors_name_the_field():
    with pytest.raises(ValidationError, match="dataset 'no_such_task' is not a reasoning-gym"):
        ReasoningGym(dataset="no_such_task")
    with pytest.raises(ValidationError, match=r"config keys \['digits'\] are not options"):
        ReasoningGym(config={"digits": 2})
    with pytest.raises(ValidationError, match="max_terms must be >= min_terms"):
        ReasoningGym(config={"min_terms": 3, "max_terms": 2})
    with pytest.raises(ValidationError, match="train_size"):
        ReasoningGym(train_size=0)
    small = ReasoningGym(config={"min_terms": 1, "max_terms": 1, "min_digits": 1,
                                 "max_digits": 1}, train_size=11, heldout_size=1)
    with pytest.raises(ValueError, match="train_size=11: 'chain_sum' .* gave only 10"):
        small.train_prompts()


MIX = {"datasets": [
    {"name": "number_sorting", "weight": 0.7, "config": {"min_numbers": 3, "max_numbers": 4}},
    {"name": "word_sorting", "weight": 0.3, "config": {"min_words": 3, "max_words": 4}}]}


def test_composite_mixes_datasets_from_plain_config():
    task = ReasoningGym(dataset="composite", config=MIX, train_size=40, heldout_size=10)
    rows = task.train_prompts().to_pylist() + task.heldout_prompts().to_pylist()
    assert {r["task"] for r in rows} == {"number_sorting", "word_sorting"}
    assert all(r["prompt_id"] == prompt_id("composite", r["prompt"]) for r in rows)
    for row in rows[:6]:  # each member's own scorer, through the mixture
        assert task.score(row["answer"], row["answer"], row["meta"]) == 1.0
        assert task.score("[]", row["answer"], row["meta"]) < 1.0
    assert ReasoningGym.model_validate(task.model_dump()).train_prompts().equals(
        task.train_prompts())  # the spec round-trips as plain data


def test_composite_config_errors_name_the_member():
    with pytest.raises(ValidationError, match="invalid for 'composite'.*'nam'"):
        ReasoningGym(dataset="composite", config={"datasets": [{"nam": "chain_sum"}]})
    with pytest.raises(ValidationError, match="invalid for 'composite'"):
        ReasoningGym(dataset="composite", config={"datasets": [
            {"name": "no_such_task", "weight": 1.0, "config": {}}]})


# --------------------------------------------------------------------------- jsonl


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_jsonl_missing_key_names_file_line_and_key(tmp_path):
    path = _write(tmp_path / "qa.jsonl", [{"prompt": "1+1=", "answer": "2"}, {"prompt": "2+2="}])
    with pytest.raises(ValueError, match=r"qa\.jsonl:2: no column 'answer'"):
        JsonlTask(path=path, heldout_fraction=0.5).train_prompts()


def test_jsonl_fraction_split_is_stable_and_disjoint(tmp_path):
    rows = [{"prompt": f"{i}+1=", "answer": str(i + 1), "meta": {"i": i}} for i in range(200)]
    path = _write(tmp_path / "add.jsonl", rows + rows[:5])  # duplicates are kept once
    task = JsonlTask(path=path, heldout_fraction=0.25)
    train, held = task.train_prompts(), task.heldout_prompts()
    assert train.schema == PROMPT_SCHEMA and train.num_rows + held.num_rows == 200
    assert 25 < held.num_rows < 75
    train_ids = set(train.column("prompt_id").to_pylist())
    assert not train_ids & set(held.column("prompt_id").to_pylist())
    assert held.equals(JsonlTask(path=path, heldout_fraction=0.25).heldout_prompts())
    assert train.column("task")[0].as_py() == "add"
    assert json.loads(train.column("meta")[0].as_py())["i"] >= 0


def test_jsonl_heldout_file_is_removed_from_training(tmp_path):
    path = _write(tmp_path / "t.jsonl", [{"prompt": p, "answer": "1"} for p in "abc"])
    held = _write(tmp_path / "h.jsonl", [{"prompt": "b", "answer": "1"}])
    task = JsonlTask(path=path, heldout_path=held)
    assert task.train_prompts().column("prompt").to_pylist() == ["a", "c"]
    assert task.heldout_prompts().column("prompt").to_pylist() == ["b"]


def test_jsonl_scorers(tmp_path):
    path = _write(tmp_path / "m.jsonl", [{"prompt": "p", "answer": "1"}])
    exact = JsonlTask(path=path, heldout_fraction=0.5)
    assert exact.score(" 42 ", "42", None) == 1.0 and exact.score("42.0", "42", None) == 0.0
    math = JsonlTask(path=path, heldout_fraction=0.5, scorer="math")
    assert math.score("The answer is $\\frac{1}{2}$", "0.5", None) == 1.0
    assert math.score("$3$", "0.5", None) == 0.0


def test_jsonl_config_errors(tmp_path):
    with pytest.raises(ValidationError, match="exactly one of heldout_path"):
        JsonlTask(path="x.jsonl")
    with pytest.raises(ValidationError, match="exactly one of heldout_path"):
        JsonlTask(path="x.jsonl", heldout_path="y.jsonl", heldout_fraction=0.1)
    with pytest.raises(FileNotFoundError, match="x.jsonl"):
        JsonlTask(path=str(tmp_path / "x.jsonl"), heldout_fraction=0.1).train_prompts()
