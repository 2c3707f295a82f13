"""The rollout schema: declared once, documented, and enforced by conform()."""

from __future__ import annotations

import pyarrow as pa
import pytest

from gfcr.core.rollout import COLUMNS, ROLLOUT_SCHEMA, SchemaError, col, conform, prompt_id
from gfcr.core.trajectory import TURNS_TYPE, loss_mask


def _row(**changes):
    row = {c.name: None for c in COLUMNS}
    row.update(run_id="r", step=0, rollout_id="x", prompt_id="p", group_id="g", sample_idx=0,
               task="t", prompt="1+1=", completion="2", prompt_ids=[1, 2],
               completion_ids=[3], logprobs=[-0.5], policy_version_start=0,
               policy_version_end=0, finish_reason="stop", status="complete", kept=True,
               replay_count=0, n_tokens=1, gen_seconds=0.1,
               created_at=pa.scalar(0, pa.timestamp("us", tz="UTC")).as_py())
    row.update(changes)
    return row


def test_schema_snapshot():
    assert ROLLOUT_SCHEMA.names == [
        "run_id", "step", "rollout_id", "prompt_id", "group_id", "sample_idx", "parent_id",
        "task", "prompt", "answer", "meta", "completion", "prompt_ids", "completion_ids",
        "logprobs", "policy_version_start", "policy_version_end", "finish_reason", "status",
        "reward", "rewards", "score_error", "advantage", "kept", "dropped_by", "drop_reason",
        "consumed_at_step", "replay_count", "n_tokens", "gen_seconds", "created_at", "turns"]
    assert str(ROLLOUT_SCHEMA.field("rewards").type) == "map<string, double>"
    assert str(ROLLOUT_SCHEMA.field("logprobs").type) == "list<item: float>"
    assert all(c.doc.endswith(".") for c in COLUMNS)
    assert col.DROP_REASON == "drop_reason"


def test_prompt_id_is_stable_and_task_scoped():
    assert prompt_id("chain_sum", "1+1=") == prompt_id("chain_sum", "1+1=")
    assert prompt_id("chain_sum", "1+1=") != prompt_id("other", "1+1=")
    assert len(prompt_id("a", "b")) == 16


def test_conform_orders_casts_and_keeps_extras():
    table = pa.Table.from_pylist([_row()])
    shuffled = table.select(list(reversed(table.column_names)))
    shuffled = shuffled.append_column("hint_len", pa.array([3]))
    out = conform(shuffled.set_column(shuffled.schema.get_field_index("step"), "step",
                                      pa.array([0], pa.int32())))
    assert out.schema.names[:len(COLUMNS)] == ROLLOUT_SCHEMA.names
    assert out.schema.field("step").type == pa.int64()
    assert out.column_names[-1] == "hint_len"


def test_conform_names_every_problem():
    table = pa.Table.from_pylist([_row()]).drop_columns(["prompt", "kept"])
    table = table.set_column(table.schema.get_field_index("step"), "step",
                             pa.array(["zero"]))
    with pytest.raises(SchemaError) as info:
        conform(table, where="output of 'group'")
    message = str(info.value)
    assert "output of 'group'" in message
    assert "missing column 'prompt'" in message and "missing column 'kept'" in message
    assert "column 'step' has type string" in message


def test_conform_rejects_nulls_in_required_columns():
    table = pa.Table.from_pylist([_row(completion=None)])
    with pytest.raises(SchemaError, match="'completion' has 1 null"):
        conform(table)


def test_conform_gives_a_single_turn_row_its_turns_with_the_hint_as_a_forced_prefix():
    rows = [_row(rollout_id="a", completion_ids=[3, 4, 5], logprobs=[-0.1, -0.2, -0.3]),
            _row(rollout_id="b", completion_ids=[6, 7], logprobs=[-1.0, -2.0])]
    table = pa.Table.from_pylist(rows).drop_columns(["turns"])
    out = conform(table.append_column("hint_tokens", pa.array([0, 1], pa.int32())))
    a, b = out.column("turns").to_pylist()
    assert [(t["role"], t["source"], t["token_ids"]) for t in a] == [
        ("user", "environment", [1, 2]), ("assistant", "policy", [3, 4, 5])]
    assert a[0]["logprobs"] is None and a[0]["mask"] is None
    assert a[1]["logprobs"] == pytest.approx([-0.1, -0.2, -0.3]) and loss_mask(a) == [True] * 3
    assert [(t["source"], t["token_ids"], t["mask"]) for t in b[1:]] == [
        ("forced", [6], [False]), ("policy", [7], [True])]
    assert loss_mask(b) == [False, True]
    flat = [i for t in b[1:] for i in t["token_ids"]]
    assert flat == out.column("completion_ids")[1].as_py()  # the turns say what the row says


def test_conform_keeps_given_turns_and_fills_only_missing_ones():
    turns = [{"role": "user", "source": "environment", "token_ids": [1, 2], "logprobs": None,
              "mask": None, "tool_name": None, "tool_error": None, "reward": None},
             {"role": "assistant", "source": "policy", "token_ids": [3], "logprobs": [-0.5],
              "mask": [True], "tool_name": "python", "tool_error": None, "reward": 0.5},
             {"role": "tool", "source": "tool", "token_ids": [9, 9], "logprobs": None,
              "mask": None, "tool_name": "python", "tool_error": "Timeout", "reward": None}]
    table = pa.Table.from_pylist([_row(rollout_id="a"), _row(rollout_id="b")])
    given = pa.array([turns, None], TURNS_TYPE)
    out = conform(table.set_column(table.column_names.index("turns"), "turns", given))
    kept, filled = out.column("turns").to_pylist()
    assert kept == turns and loss_mask(kept) == [True, False, False]
    assert [t["source"] for t in filled] == ["environment", "policy"]


def test_conform_derives_the_flat_columns_from_the_turns_of_a_row_that_has_them():
    from gfcr.core.trajectory import Trajectory

    turns = (Trajectory().start_ids([1, 2]).add_policy([3], [-0.5])
             .add_observation([9, 9], "tool", tool_name="python").add_policy([4], [-0.25]))
    table = pa.Table.from_pylist([_row(rollout_id="a", completion_ids=[7], logprobs=[-9.0]),
                                  _row(rollout_id="b", completion_ids=[7], logprobs=[-9.0])])
    given = pa.array([turns.rows(), None], TURNS_TYPE)
    out = conform(table.set_column(table.column_names.index("turns"), "turns", given))
    assert out.column("prompt_ids").to_pylist() == [[1, 2], [1, 2]]
    assert out.column("completion_ids").to_pylist() == [[3, 9, 9, 4], [7]]  # b: its own
    assert out.column("logprobs").to_pylist() == [[-0.5, 0.0, 0.0, -0.25], [-9.0]]
    only_turns = table.drop_columns(["prompt_ids", "completion_ids", "logprobs", "turns"])
    out = conform(only_turns.append_column("turns", pa.array([turns.rows()] * 2, TURNS_TYPE)))
    assert out.column("completion_ids").to_pylist() == [[3, 9, 9, 4]] * 2
    bad = turns.rows()
    bad[1]["logprobs"] = []
    with pytest.raises(SchemaError, match="output of 'x': column 'turns': row 0: turn 1 has 0"):
        conform(table.set_column(table.column_names.index("turns"), "turns",
                                 pa.array([bad, None], TURNS_TYPE)), where="output of 'x'")


def test_a_code_verdict_is_no_scorer_failure_in_python_or_sql():
    # a program that crashed or hit a limit is Wrong (reward 0, reason kept): the step's
    # warnings, the report's error share and the doctor count only scorer failures
    import duckdb

    from gfcr.core.rollout import SCORER_FAILED_SQL, scorer_failed

    messages = ["Wrong: the program raised ZeroDivisionError",
                "SandboxViolation: memory limit", "ValueError: bad scorer", None]
    assert [scorer_failed(m) for m in messages] == [False, False, True, False]
    rows = duckdb.sql(f"SELECT {SCORER_FAILED_SQL} FROM (VALUES (?), (?), (?), (?)) "
                      "t(score_error)", params=messages).fetchall()
    assert [r[0] for r in rows] == [False, False, True, False]
