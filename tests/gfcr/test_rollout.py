"""The rollout schema: declared once, documented, and enforced by conform()."""

from __future__ import annotations

import pyarrow as pa
import pytest

from gfcr.rollout import COLUMNS, ROLLOUT_SCHEMA, SchemaError, col, conform, prompt_id


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
        "consumed_at_step", "replay_count", "n_tokens", "gen_seconds", "created_at"]
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
