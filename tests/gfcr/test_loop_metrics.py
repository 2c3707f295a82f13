"""The loop's token count: tokens generated in the step, never a prefix or a row again."""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from gfcr.core.rollout import NEW_TOKENS, col
from gfcr.launch.run import execute
from gfcr.runner.metrics import generated_tokens, rollout_metrics
from store import RolloutStore
from tests.resources.control import april_pipeline
from tests.resources.rollouts import rollouts


def test_tokens_count_what_the_step_generated():
    table = rollouts(["a", "a", "a", "b", "c"], completion=["x" * 6, "x" * 10, "x" * 5,
                                                           "x" * 7, "x" * 3],
                     replay_count=[0, 0, 0, 1, 0],
                     **{NEW_TOKENS: [6, 4, 0, 7, None]})
    # fresh: 6; continued from a 6-token prefix: 4; carried over: 0; replayed: 0; a row
    # whose generate stage wrote no new_tokens: all its 3 tokens
    assert generated_tokens(table).tolist() == [6, 4, 0, 0, 3]
    m = rollout_metrics(table)
    assert (m["tokens"], m["row_tokens"]) == (13.0, 31.0)
    assert generated_tokens(table.drop_columns([NEW_TOKENS])).tolist() == [6, 10, 5, 0, 3]


def test_april_steps_count_continued_prefixes_and_carried_samples_once(tmp_path):
    summary = execute(april_pipeline(steps=3), root=tmp_path, executor="local")
    with RolloutStore.open(tmp_path / "store", read_only=True) as s:
        rows = s.sql("SELECT * FROM rollouts WHERE run_id = $r", {"r": summary.run_id}).to_pylist()
    by_id = {r[col.ROLLOUT_ID]: r for r in rows}
    made, stored = defaultdict(int), defaultdict(int)
    for r in rows:
        parent = by_id.get(r[col.PARENT_ID])
        made[r[col.STEP]] += r[col.N_TOKENS] - (parent[col.N_TOKENS] if parent else 0)
        stored[r[col.STEP]] += r[col.N_TOKENS]
        assert r[NEW_TOKENS] == r[col.N_TOKENS] - (parent[col.N_TOKENS] if parent else 0)
    tokens = [m["tokens"] for m in summary.history]
    assert tokens == [made[s] for s in range(3)]
    assert [m["row_tokens"] for m in summary.history] == [stored[s] for s in range(3)]
    assert np.any(np.array(tokens) < [stored[s] for s in range(3)]), "nothing was continued"
