"""Tree rollouts (LATR) against independent samples at the same token budget.

    .venv/bin/python bench/tree.py              # table
    .venv/bin/python bench/tree.py --json       # one JSON object
    .venv/bin/python bench/tree.py --prompts 16 --seeds 0   # quick look

``distinct_ratio`` is the tree's mean number of distinct answers per prompt divided by
that of independent samples given the same tokens (see ``bench/_tree.py``).
The first run trains the default warm start (about 90 s on 2 cores) and caches it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from _tree import tree_vs_independent


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--n", type=int, default=8, help="leaves per tree (group size)")
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--branch-prob", type=float, default=0.2)
    parser.add_argument("--lookahead", type=int, default=2)
    parser.add_argument("--min-distance", type=float, default=0.4)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--root", type=Path, default=Path(".gfcr"),
                        help="where the warm start is cached (cache/ under it)")
    parser.add_argument("--sft-steps", type=int, default=None,
                        help="override the default warm start's steps (a separate cache)")
    args = parser.parse_args(argv)
    result = tree_vs_independent(
        prompts=args.prompts, n=args.n, max_tokens=args.max_tokens,
        branch_prob=args.branch_prob, lookahead=args.lookahead,
        min_distance=args.min_distance, temperature=args.temperature,
        seeds=tuple(args.seeds), root=args.root,
        sft_steps=args.sft_steps)
    if args.json:
        print(json.dumps(result))
        return
    headers = ["side", "distinct/prompt", "distinct rate", "rollouts/prompt", "tokens/prompt",
               "coverage"]
    print("\t".join(headers))
    for side in ("tree", "independent"):
        r = result[side]
        print("\t".join([side, f"{r['distinct_per_prompt']:.2f}", f"{r['distinct_rate']:.3f}",
                         f"{r['rollouts_per_prompt']:.2f}", f"{r['tokens_per_prompt']:.1f}",
                         f"{r['coverage']:.3f}"]))
    print(f"distinct_ratio (tree / independent, same tokens): {result['distinct_ratio']:.2f}")
    print("settings: " + ", ".join(f"{k}={v}" for k, v in result["settings"].items()))


if __name__ == "__main__":
    main()
