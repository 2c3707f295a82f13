"""Benchmark the operators' history reads: typed ``LakeHistory.rows`` plus Arrow aggregation
in the operator (issue 21, item 6) against the per-operator SQL the store ran before, in
the same run and on the same store.

The store holds ``--rows`` small rollouts of one run over ``--steps`` steps (groups of 8,
30% rewarded, 80% kept and trained on, 10% partial). Each read is timed as a stage calls
it at the last step (median of 3 after a warm-up): per-prompt discounted evidence
(DOTS, VADE, the beliefs of the selectors), per-(step, prompt) losses (Prompt-GDRO),
recent trained groups with their replay counts (Rollout Replay), recent outcomes (the
quality predictor) and pending partial rows (recycling). ``same`` says whether both
give the same table (floats within 1e-9). The baseline SQL is the text the store used
before the change, kept here only to compare against.

    python bench/history_reads.py [--rows 200000] [--steps 20] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402

from bench.store import median, rollouts  # noqa: E402
from gfcr.core.rollout import col  # noqa: E402
from stages.control.quality import recent_rollouts  # noqa: E402
from stages.replay import _reads  # noqa: E402
from stages.replay.gdro import step_losses  # noqa: E402
from stages.replay.recycle import pending_partials  # noqa: E402
from stages.replay.rollout_replay import recent_trained  # noqa: E402
from store import RolloutStore  # noqa: E402
from store.history import LakeHistory  # noqa: E402

RUN = "bench"
_SRC = "(SELECT * FROM lake.rollouts WHERE run_id = 'bench') AS rollouts"
_ATTEMPT = "status = 'complete' AND reward IS NOT NULL AND replay_count = 0"
BASELINE = {
    "prompt_evidence": lambda now: f"""
        SELECT prompt_id, sum(pow(0.5, ({now} - step) / 8.0))::DOUBLE AS n,
               sum(CASE WHEN reward > 0 THEN pow(0.5, ({now} - step) / 8.0) ELSE 0 END)::DOUBLE AS s,
               max(step)::BIGINT AS last_step
        FROM {_SRC} WHERE {_ATTEMPT} GROUP BY prompt_id ORDER BY prompt_id""",
    "step_losses": lambda now: f"""
        SELECT step, prompt_id, count(*)::BIGINT AS n,
               avg(CASE WHEN reward > 0 THEN 0.0 ELSE 1.0 END) AS loss
        FROM {_SRC} WHERE {_ATTEMPT} GROUP BY step, prompt_id ORDER BY step, prompt_id""",
    "recent_trained": lambda now: f"""
        WITH used AS (SELECT parent_id, count(*)::BIGINT AS times FROM {_SRC}
                      WHERE replay_count > 0 AND parent_id IS NOT NULL GROUP BY parent_id),
        signal AS (SELECT group_id FROM {_SRC} WHERE kept AND rollouts.step >= {now - 4}
                   AND replay_count = 0 GROUP BY group_id HAVING max(reward) > min(reward))
        SELECT rollouts.*, coalesce(used.times, 0)::BIGINT AS _times
        FROM {_SRC} LEFT JOIN used ON used.parent_id = rollouts.rollout_id
        WHERE rollouts.kept AND rollouts.consumed_at_step IS NOT NULL AND rollouts.status = 'complete'
          AND rollouts.replay_count = 0 AND rollouts.step >= {now - 4}
          AND rollouts.group_id IN (SELECT group_id FROM signal)
        ORDER BY rollouts.step DESC, rollouts.group_id, rollouts.sample_idx""",
    "recent_outcomes": lambda now: f"""
        SELECT logprobs, reward FROM (SELECT * FROM lake.rollouts WHERE run_id = 'bench'
        AND step >= {now - 4}) WHERE {_ATTEMPT} ORDER BY step DESC, rollout_id LIMIT 512""",
    "pending_partials": lambda now: f"""
        SELECT p.* FROM (SELECT * FROM lake.rollouts WHERE run_id = 'bench') AS p
        WHERE p.status = 'partial' AND NOT EXISTS (SELECT 1 FROM (SELECT * FROM lake.rollouts
              WHERE run_id = 'bench') AS c WHERE c.parent_id = p.rollout_id)
        ORDER BY p.step, p.group_id, p.sample_idx""",
}


def typed(history: LakeHistory, name: str, now: int) -> pa.Table:
    """The operator's read as it is now: ``LakeHistory.rows`` and Arrow."""
    if name == "prompt_evidence":
        return _reads.prompt_evidence(history, now=now, half_life=8.0)
    if name == "step_losses":
        return step_losses(history)
    if name == "recent_trained":
        return recent_trained(history, now=now, window=4)
    if name == "recent_outcomes":
        logprobs, reward = recent_rollouts(history, RUN, now - 4)
        return pa.table({"logprobs": pa.array(logprobs, pa.list_(pa.float32())), "reward": reward})
    return pending_partials(history, RUN)


def same(a: pa.Table, b: pa.Table) -> bool:
    if a.num_rows != b.num_rows or a.column_names != b.column_names:
        return False
    for name in a.column_names:
        x, y = a.column(name).to_pylist(), b.column(name).to_pylist()
        if pa.types.is_floating(a.schema.field(name).type):
            if not np.allclose(np.array(x, float), np.array(y, float), rtol=1e-9, atol=1e-12, equal_nan=True):
                return False
        elif x != y:
            return False
    return True


def build(path: Path, total: int, steps: int) -> None:
    per = -(-total // steps)
    with RolloutStore.open(path) as store:
        for step in range(steps):
            t = rollouts(RUN, step, per, prompt_tokens=8, completion_tokens=16, n_prompts=5_000, seed=step)
            consumed = pa.array(np.where(t.column(col.KEPT).to_numpy(zero_copy_only=False), step, -1))
            t = t.set_column(t.schema.get_field_index(col.CONSUMED_AT_STEP), col.CONSUMED_AT_STEP,
                             pc.if_else(pc.equal(consumed, -1), None, consumed))
            store.commit_step(RUN, step, t, policy_version=step, metrics={})


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    out: dict[str, Any] = {"rows": args.rows, "steps": args.steps}
    with tempfile.TemporaryDirectory(prefix="gfcr-bench-reads-") as tmp:
        build(Path(tmp) / "store", args.rows, args.steps)
        with RolloutStore.open(Path(tmp) / "store", read_only=True) as store:
            now = args.steps
            history = LakeHistory(store, RUN, as_of_step=args.steps - 1)
            for name, sql in BASELINE.items():
                old = median(lambda: store.sql(sql(now)))
                new = median(lambda: typed(history, name, now))
                out[name] = {"sql_s": old, "typed_s": new, "typed_vs_sql": new / old,
                             "same": same(store.sql(sql(now)), typed(history, name, now))}
    if args.json:
        print(json.dumps(out))
        return
    print(f"{args.rows} rollouts, {args.steps} steps")
    print(f"{'read':<18}{'SQL s':>10}{'typed s':>10}{'typed/SQL':>11}{'same':>6}")
    for name in BASELINE:
        r = out[name]
        print(f"{name:<18}{r['sql_s']:>10.4f}{r['typed_s']:>10.4f}{r['typed_vs_sql']:>11.2f}{r['same']!s:>6}")


if __name__ == "__main__":
    main()
