"""In-process asynchronous steps: steps per second with ``max_staleness`` 1 against 0.

One run of each, same pipeline and seed, in this process with no fleet (the
executor "local"): with k = 1 the engine generates step t+1's round-0 batch on its own
thread, with its own copy of the weights, while step t scores, trains and commits
(gfcr.runner.rounds, gfcr.runner.inprocess). Steps per second are counted over steps 1.. (step 0 has
nothing ahead of it); the table also gives each setup's mean time in the generate and
train stages per step, which bound what overlap can gain: at best a step takes
max(generate, the rest) instead of their sum.

    python -m bench.async_steps [--steps 8] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
from statistics import mean
from tempfile import TemporaryDirectory
from typing import Any


def _pipeline(steps: int, k: int) -> Any:
    """The tiny policy on the digits task, with a batch large enough that generating and
    training each take a good share of a step."""
    from stages import GRPO, GroupSample, UniformSampler, Verify
    from tests.conftest import tiny_pipeline
    from tests.resources.digits import Digits

    return tiny_pipeline(steps=steps, task=Digits(), max_staleness=k, stages=[
        UniformSampler(batch=8), GroupSample(n=8, max_tokens=12), Verify(),
        GRPO(lr=1e-2, micro_batch=64)])


def _measure(steps: int, k: int) -> dict[str, float]:
    from gfcr.launch.run import execute

    with TemporaryDirectory() as root:
        summary = execute(_pipeline(steps, k), root=root, executor="local", run_id=f"k{k}")
    timed = summary.history[1:]
    seconds = sum(m["step_seconds"] for m in timed)
    return {"k": float(k), "steps_per_s": len(timed) / seconds,
            "generate_s": mean(m.get("time/group", 0.0) for m in timed),
            "train_s": mean(m.get("time/grpo", 0.0) for m in timed),
            "step_s": seconds / len(timed),
            "staleness_max": max(m.get("staleness/max", 0.0) for m in summary.history)}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    rows = [_measure(args.steps, k) for k in (0, 1)]
    ratio = rows[1]["steps_per_s"] / rows[0]["steps_per_s"]
    if args.json:
        print(json.dumps({"setups": rows, "ratio_k1_over_k0": ratio}, indent=2))
        return 0
    print(f"{'k':>2} {'steps/s':>8} {'step s':>7} {'generate s':>11} {'train s':>8} "
          f"{'staleness':>9}")
    for r in rows:
        print(f"{int(r['k']):>2} {r['steps_per_s']:>8.3f} {r['step_s']:>7.3f} "
              f"{r['generate_s']:>11.3f} {r['train_s']:>8.3f} {r['staleness_max']:>9.0f}")
    print(f"k=1 / k=0 steps per second: {ratio:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
