"""Benchmark the rollout store against plain Parquet, in the same run.

1. Commit throughput: ``RolloutStore.commit_step`` of 4096-rollout steps with realistic
   sizes (prompts of ~200 tokens, completions of ~1024 tokens with their ids and
   logprobs) against ``pyarrow.parquet.write_table`` of the same Arrow table. Reported as
   rollouts/s for each and their ratio ``commit_vs_parquet`` (target >= 0.7).
2. LakeHistory latency over 1M stored rollouts: the ``prompt_history`` view over every prompt
   (``history_query_s_1m``, target < 1 s on 2 cores) and ``LakeHistory.prompt_stats`` for a
   batch of 256 prompts, as a curriculum stage calls it each step. Median of 3 after a
   warm-up.

    python bench/store.py [--steps 7] [--history-rows 1000000] [--clock wall|process] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

# Run as a script, this file's folder comes first on sys.path and its name would shadow
# the ``store`` package; drop that entry before importing it.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from gfcr.core.rollout import ROLLOUT_SCHEMA, col  # noqa: E402
from store import RolloutStore  # noqa: E402
from store.history import LakeHistory  # noqa: E402

GROUP = 8
CLOCKS = {"wall": time.perf_counter, "process": time.process_time}


def _texts(rng: np.random.Generator, n: int, chars: int) -> pa.Array:
    letters = rng.integers(97, 123, size=n * chars, dtype=np.uint8)
    letters[rng.random(n * chars) < 0.18] = 32
    offsets = np.arange(0, (n + 1) * chars, chars, dtype=np.int32)
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(letters.tobytes()))


def _lists(values: np.ndarray, n: int, length: int, value_type: pa.DataType) -> pa.Array:
    offsets = pa.array(np.arange(0, (n + 1) * length, length, dtype=np.int32))
    return pa.ListArray.from_arrays(offsets, pa.array(values, value_type)).cast(pa.list_(value_type))


def rollouts(run_id: str, step: int, n: int, *, prompt_tokens: int, completion_tokens: int,
             n_prompts: int, seed: int) -> pa.Table:
    """``n`` rollouts in groups of 8 with random text, token ids and logprobs of the given sizes."""
    rng = np.random.default_rng(seed)
    groups = np.arange(n) // GROUP
    prompts = rng.integers(0, n_prompts, size=n // GROUP + 1)[groups]
    reward = (rng.random(n) < 0.3).astype(np.float64)
    status = np.where(rng.random(n) < 0.9, "complete", "partial")
    data = {
        col.RUN_ID: pa.array([run_id] * n), col.STEP: pa.array(np.full(n, step)),
        col.ROLLOUT_ID: pa.array([f"{run_id}/{step}/{i}" for i in range(n)]),
        col.PROMPT_ID: pa.array([f"p{p:07d}" for p in prompts]),
        col.GROUP_ID: pa.array([f"{run_id}/{step}/g{g}" for g in groups]),
        col.SAMPLE_IDX: pa.array(np.arange(n) % GROUP, pa.int32()),
        col.PARENT_ID: pa.nulls(n, pa.string()), col.TASK: pa.array(["math"] * n),
        col.PROMPT: _texts(rng, n, prompt_tokens * 4), col.ANSWER: pa.array([str(p) for p in prompts]),
        col.META: pa.nulls(n, pa.string()), col.COMPLETION: _texts(rng, n, completion_tokens * 4),
        col.PROMPT_IDS: _lists(rng.integers(0, 32000, n * prompt_tokens), n, prompt_tokens, pa.int32()),
        col.COMPLETION_IDS: _lists(rng.integers(0, 32000, n * completion_tokens), n, completion_tokens, pa.int32()),
        col.LOGPROBS: _lists(-rng.exponential(1.0, n * completion_tokens), n, completion_tokens, pa.float32()),
        col.POLICY_VERSION_START: pa.array(np.full(n, step)), col.POLICY_VERSION_END: pa.array(np.full(n, step)),
        col.FINISH_REASON: pa.array(np.where(status == "complete", "stop", "aborted")),
        col.STATUS: pa.array(status), col.REWARD: pa.array(reward),
        col.REWARDS: pa.array([[("correct", r)] for r in reward], pa.map_(pa.string(), pa.float64())),
        col.SCORE_ERROR: pa.nulls(n, pa.string()), col.ADVANTAGE: pa.array(reward - reward.mean()),
        col.KEPT: pa.array(rng.random(n) < 0.8), col.DROPPED_BY: pa.nulls(n, pa.string()),
        col.DROP_REASON: pa.nulls(n, pa.string()), col.CONSUMED_AT_STEP: pa.nulls(n, pa.int64()),
        col.REPLAY_COUNT: pa.array(np.zeros(n, np.int32)),
        col.N_TOKENS: pa.array(np.full(n, completion_tokens, np.int32)),
        col.GEN_SECONDS: pa.array(rng.random(n)),
        col.CREATED_AT: pa.array([datetime.now(timezone.utc)] * n, pa.timestamp("us", tz="UTC")),
        col.TURNS: pa.nulls(n, ROLLOUT_SCHEMA.field(col.TURNS).type),
    }
    return pa.table(data).cast(ROLLOUT_SCHEMA)


def bench_commit(root: Path, steps: int, rows: int, clock: str = "wall") -> dict[str, float]:
    """Median seconds per 4096-rollout step: store commit vs pyarrow.parquet.write_table.

    The two are interleaved step by step so that load from other processes hits both.
    """
    now = CLOCKS[clock]
    commit_s, parquet_s = [], []
    with RolloutStore.open(root / "commit") as store:
        for step in range(steps):
            table = rollouts("bench", step, rows, prompt_tokens=200, completion_tokens=1024,
                             n_prompts=10_000, seed=step)
            start = now()
            pq.write_table(table, root / f"plain-{step}.parquet")
            parquet_s.append(now() - start)
            start = now()
            store.commit_step("bench", step, table, policy_version=step, metrics={"loss": 0.0})
            commit_s.append(now() - start)
    commit, parquet = statistics.median(commit_s), statistics.median(parquet_s)
    mb = table.nbytes / 2**20
    return {"step_mb": mb, "commit_s": commit, "parquet_s": parquet, "commit_rollouts_s": rows / commit,
            "parquet_rollouts_s": rows / parquet, "commit_vs_parquet": parquet / commit}


def bench_history(root: Path, total: int, per_step: int = 65_536) -> dict[str, float]:
    """Seconds to query prompt history over ``total`` stored (small) rollouts."""
    path = root / "history"
    with RolloutStore.open(path) as store:
        for step in range(-(-total // per_step)):
            n = min(per_step, total - step * per_step)
            table = rollouts("hist", step, n, prompt_tokens=8, completion_tokens=16, n_prompts=50_000, seed=step)
            store.commit_step("hist", step, table, policy_version=step, metrics={})
    with RolloutStore.open(path, read_only=True) as store:
        everything = median(lambda: store.sql("SELECT * FROM prompt_history"))
        n_prompts = store.sql("SELECT count(*) AS n FROM prompt_history").to_pylist()[0]["n"]
        batch = [f"p{p:07d}" for p in range(0, 50_000, 50_000 // 256)][:256]
        history = LakeHistory(store, run_id="hist")
        some = median(lambda: history.prompt_stats(batch))
    return {"history_rows": total, "history_prompts": n_prompts, "history_query_s_1m": everything,
            "prompt_stats_256_s": some}


def median(fn, repeats: int = 3) -> float:
    """Median seconds of ``repeats`` calls of ``fn`` after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=7, help="4096-rollout steps to commit")
    parser.add_argument("--rows", type=int, default=4096, help="rollouts per committed step")
    parser.add_argument("--history-rows", type=int, default=1_000_000)
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                        help="process: CPU time of this process (steadier on a shared machine)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="gfcr-bench-store-") as tmp:
        result = bench_commit(Path(tmp), args.steps, args.rows, args.clock) | bench_history(Path(tmp), args.history_rows)
    result["clock"] = args.clock
    if args.json:
        print(json.dumps(result))
        return
    print(f"{'metric':<28}{'value':>14}")
    for key, value in result.items():
        print(f"{key:<28}{value:>14.3f}" if isinstance(value, float) else f"{key:<28}{value!s:>14}")
    print(f"targets: commit_vs_parquet >= 0.7 ({'ok' if result['commit_vs_parquet'] >= 0.7 else 'MISSED'}), "
          f"history_query_s_1m < 1 s ({'ok' if result['history_query_s_1m'] < 1 else 'MISSED'})", file=sys.stderr)


if __name__ == "__main__":
    main()
