"""Quickstart: write a pipeline in Python, run it, and query its rollouts with SQL.

    python examples/quickstart.py [ROOT]

A deliberately small pipeline (tiny model, two steps) so it runs in seconds on a laptop;
swap in `pipelines.default.SETUP` and more steps for a real run.
"""

from __future__ import annotations

import sys
from pathlib import Path

from gfcr import Evaluation, Pipeline, execute
from stages import (GRPO, HF, DynamicSampling, GroupSample, ReasoningGym, TinyLlama,
                    UniformSampler, Verify)
from store import RolloutStore


def main(root: Path) -> None:
    pipeline = Pipeline(
        name="quickstart",
        steps=2,
        task=ReasoningGym(train_size=64, heldout_size=16),
        policy=TinyLlama(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64),
        engine=HF(device="cpu"),
        stages=[UniformSampler(batch=4), GroupSample(n=4, max_tokens=6), Verify(),
                DynamicSampling(), GRPO(lr=1e-3)],
        evaluation=Evaluation(size=8, max_tokens=6),
    )
    summary = execute(pipeline, root=root, executor="local")
    print(f"run {summary.run_id}: {summary.rollouts} rollouts stored in {summary.store}")
    with RolloutStore.open(root / "store", read_only=True) as store:
        print(store.sql("SELECT step, kept, dropped_by, count(*) AS n FROM rollouts "
                        "GROUP BY ALL ORDER BY ALL").to_pylist())


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(".gfcr-quickstart"))
