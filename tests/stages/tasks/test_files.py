"""FileTask: a user's dataset file in each format, each scorer, chat prompts, the split,
and malformed files refused when the pipeline is built, naming file, line and column."""

from __future__ import annotations

import json
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pydantic import ValidationError

from gfcr.core.pipeline import PipelineError
from gfcr.core.rollout import PROMPT_SCHEMA
from stages import FileTask
from tests.conftest import tiny_pipeline

RECORDS = [{"question": f"{i} + {i % 7} =", "answer": str(i + i % 7), "id": i,
            "source": "sums"} for i in range(40)]


def _jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def _write(tmp_path, fmt):
    table = pa.Table.from_pylist(RECORDS)
    if fmt == "jsonl":
        return _jsonl(tmp_path / "sums.jsonl", RECORDS)
    if fmt == "parquet":
        pq.write_table(table, tmp_path / "sums.parquet")
        return str(tmp_path / "sums.parquet")
    if fmt == "csv":
        lines = ["question,answer,id,source"] + [
            f"{r['question']},{r['answer']},{r['id']},{r['source']}" for r in RECORDS]
        (tmp_path / "sums.csv").write_text("\n".join(lines) + "\n")
        return str(tmp_path / "sums.csv")
    import datasets

    datasets.Dataset(table).save_to_disk(str(tmp_path / "sums"))
    return str(tmp_path / "sums")


@pytest.mark.parametrize("fmt", ["jsonl", "parquet", "csv", "hf_disk"])
def test_each_format_gives_the_same_prompts_and_carries_the_columns(tmp_path, fmt):
    task = FileTask(path=_write(tmp_path, fmt), seed=3, heldout_fraction=0.25)
    train, held = task.train_prompts(), task.heldout_prompts()
    assert train.schema == PROMPT_SCHEMA and (train.num_rows, held.num_rows) == (30, 10)
    rows = train.to_pylist() + held.to_pylist()
    assert sorted(r["prompt"] for r in rows) == sorted(r["question"] for r in RECORDS)
    assert {r["task"] for r in rows} == {"sums"}
    first = next(r for r in rows if r["prompt"] == "3 + 3 =")
    assert first["answer"] == "6"
    meta = json.loads(first["meta"])
    assert str(meta["id"]) == "3" and meta["source"] == "sums"  # CSV keeps text
    assert task.prompt_counts() == {"train": 30, "heldout": 10}


def test_drawn_split_is_seeded_and_disjoint_and_a_given_one_is_removed(tmp_path):
    path = _jsonl(tmp_path / "t.jsonl", RECORDS + RECORDS[:5])  # duplicates kept once
    a, b = FileTask(path=path, seed=1), FileTask(path=path, seed=1)
    c = FileTask(path=path, seed=2)
    assert a.heldout_prompts().equals(b.heldout_prompts())
    assert not a.heldout_prompts().equals(c.heldout_prompts())
    ids = [set(t.column("prompt_id").to_pylist())
           for t in (a.train_prompts(), a.heldout_prompts())]
    assert len(ids[0]) + len(ids[1]) == 40 and not ids[0] & ids[1]
    held = _jsonl(tmp_path / "held.jsonl", RECORDS[:4])
    given = FileTask(path=path, heldout_path=held)
    assert given.heldout_prompts().num_rows == 4 and given.train_prompts().num_rows == 36


def test_chat_message_prompts_give_the_user_turn(tmp_path):
    records = [{"messages": [{"role": "user", "content": f"say {i}"}], "answer": str(i)}
               for i in range(10)]
    task = FileTask(path=_jsonl(tmp_path / "chat.jsonl", records), prompt="messages")
    prompts = task.train_prompts().to_pylist() + task.heldout_prompts().to_pylist()
    assert sorted(r["prompt"] for r in prompts) == sorted(f"say {i}" for i in range(10))
    bad = records[:3] + [{"messages": [{"role": "system", "content": "be brief"},
                                       {"role": "user", "content": "hi"}], "answer": "x"}]
    with pytest.raises(ValidationError, match=r"bad\.jsonl:4: column 'messages': roles "
                                              r"\['system', 'user'\]"):
        FileTask(path=_jsonl(tmp_path / "bad.jsonl", bad), prompt="messages")


def test_each_scorer(tmp_path, monkeypatch):
    path = _jsonl(tmp_path / "t.jsonl", RECORDS)
    exact = FileTask(path=path, scorer="exact")
    assert exact.score(" 6\n", "6", None) == 1.0 and exact.score("6.0", "6", None) == 0.0
    maths = FileTask(path=path, scorer="math-verify")
    assert maths.score("so it is $\\frac{1}{2}$", "0.5", None) == 1.0
    assert maths.score("0.25", "1/2", None) == 0.0
    (tmp_path / "my_scorer.py").write_text(
        "def score(completion, answer, meta):\n"
        "    return 0.5 if meta['source'] == 'sums' and completion == answer else 0.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    own = FileTask(path=path, scorer="my_scorer:score")
    row = own.train_prompts().to_pylist()[0]
    assert own.score(row["answer"], row["answer"], row["meta"]) == 0.5
    assert own.score("no", row["answer"], row["meta"]) == 0.0
    sys.modules.pop("my_scorer", None)
    with pytest.raises(ValidationError, match="cannot import scorer 'no_such_mod:f'"):
        FileTask(path=path, scorer="no_such_mod:f")
    with pytest.raises(ValidationError, match="scorer must be 'exact', 'math-verify'"):
        FileTask(path=path, scorer="fuzzy")


@pytest.mark.parametrize("content, where", [
    ('{"question": "1+1=", "answer": "2"}\n{"question": "2+2="}\n',
     r"t\.jsonl:2: no column 'answer' \(the record has 'question'\)"),
    ('{"question": "1+1=", "answer": "2"}\n\n{"question": "2+2=", "answer": 4\n',
     r"t\.jsonl:3: not valid JSON"),
    ("", r"t\.jsonl:1: the file holds no records"),
    ('{"question": "1+1=", "answer": ""}\n', r"t\.jsonl:1: column 'answer' is empty"),
])
def test_a_malformed_file_fails_the_pipeline_before_any_step(tmp_path, content, where):
    (tmp_path / "t.jsonl").write_text(content)
    with pytest.raises(PipelineError, match=where):
        tiny_pipeline(task={"type": "file", "path": str(tmp_path / "t.jsonl")})


def test_columnar_files_name_the_missing_column_and_the_row(tmp_path):
    pq.write_table(pa.table({"q": ["a", "b"], "answer": ["1", None]}), tmp_path / "t.parquet")
    with pytest.raises(ValidationError, match=r"t\.parquet:1: no column 'question' "
                                              r"\(the file has 'q', 'answer'\)"):
        FileTask(path=str(tmp_path / "t.parquet"))
    with pytest.raises(ValidationError, match=r"t\.parquet row 2: column 'answer' is empty"):
        FileTask(path=str(tmp_path / "t.parquet"), prompt="q")
    (tmp_path / "t.csv").write_text("question,answer\n1+1=,2\n2+2=,\n")
    with pytest.raises(ValidationError, match=r"t\.csv:3: column 'answer' is empty"):
        FileTask(path=str(tmp_path / "t.csv"))
    (tmp_path / "e.csv").write_text("")
    with pytest.raises(ValidationError, match=r"e\.csv:1: the file holds no records"):
        FileTask(path=str(tmp_path / "e.csv"))
