"""What one decode step of a model costs against the batch size, on this machine: the
figure that decides whether APRIL's over-provisioning pays (bench/effects.py,
BENCHMARKS.md "Rollout effects on SmolLM2").

Per batch size, the mean time of ``--steps`` KV-cached decode steps after a prompt of
``--context`` random tokens, and its ratio to the time at ``--baseline`` sequences, all
in this one run. On a GPU a step costs about the same for 32 sequences as for 48; where
it grows with the batch, asking for 1.5 times the rollouts costs up to 1.5 times as much.

    .venv/bin/python bench/decode_cost.py                 # SmolLM2 from gfcr's model cache
    .venv/bin/python bench/decode_cost.py --json --batches 1,8,32,48
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM


def step_seconds(model: torch.nn.Module, batch: int, *, context: int, steps: int) -> float:
    """Mean seconds of one decode step for ``batch`` sequences with ``context`` cached."""
    with torch.no_grad():
        out = model(torch.randint(0, 1000, (batch, context)), use_cache=True)
        token = torch.randint(0, 1000, (batch, 1))
        started = time.perf_counter()
        for _ in range(steps):
            out = model(token, past_key_values=out.past_key_values, use_cache=True)
    return (time.perf_counter() - started) / steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--model", type=Path,
                    default=Path(".gfcr/cache/models/smollm2-135m-instruct"),
                    help="a transformers model folder (`gfcr model import smollm2` makes this one)")
    ap.add_argument("--batches", default="1,8,32,48")
    ap.add_argument("--baseline", type=int, default=32)
    ap.add_argument("--context", type=int, default=150)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (the HF engine's 1)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model = AutoModelForCausalLM.from_pretrained(args.model).eval()
    batches = sorted({*map(int, args.batches.split(",")), args.baseline})
    ms = {b: 1000 * step_seconds(model, b, context=args.context, steps=args.steps)
          for b in batches}
    result = {"ms_per_step": ms, "ratio": {b: ms[b] / ms[args.baseline] for b in batches},
              "settings": {k: str(v) for k, v in vars(args).items() if k != "json"}}
    if args.json:
        print(json.dumps(result))
        return
    print(f"{'batch':>6}{'ms a step':>11}{'ms a sequence':>15}{f'vs {args.baseline}':>9}")
    for b in batches:
        print(f"{b:>6}{ms[b]:>11.1f}{ms[b] / b:>15.2f}{result['ratio'][b]:>9.2f}")


if __name__ == "__main__":
    main()
