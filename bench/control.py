"""Control benchmark: active partial rollouts, online pruning and token budgets on a
long-tailed workload (``bench/_longtail.py``: a tiny model warm-started here on answers
whose lengths follow a power law; lengths are what the model samples).

    .venv/bin/python bench/control.py            # table
    .venv/bin/python bench/control.py --json     # one JSON object
    .venv/bin/python bench/control.py --clock wall    # headline on wall time instead

Figures:

- ``april_throughput_gain``: completed rollouts per second of generation with active
  partial rollouts (12 groups of 4 asked for, the rest stopped once 8 are complete and
  continued first next step) over synchronous generation of 8 groups of 4 (the same
  batch size), minus 1. Both runs use the same weights, the real loop and store, and are
  interleaved step by step in one process, the order alternating; median over repeats.
  A completed rollout is one that reaches the filters (status complete); time is the
  generate stage's, on this process's CPU clock by default (one torch thread; steadier on
  a shared machine) and on the wall clock, both measured in the same calls. Partials still
  pending when the run ends count as nothing (this favours the baseline).
- ``discarded``: rollouts generated and then neither completed nor stored as partial and
  continued later (pruned rows, and partials before the last step that no row
  continues). Must be 0.
- ``prune_token_saving`` / ``budget_token_saving``: 1 - generated tokens (the loop's
  ``tokens`` metric: tokens generated in each step, pruned ones included, no prefix
  counted twice) of a short GRPO run with ``OnlinePrune`` / ``TokenBudget`` (half the
  baseline's tokens per step) over the same run without, same seeds and steps, with the
  held-out greedy accuracy of each
  after the run. "Equal" accuracy: the two accuracies differ by less than two standard
  errors of a difference of proportions on the held-out set, i.e. this benchmark cannot
  tell them apart; ``*_equal_accuracy`` says whether that held.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# Run as a script, this folder comes first on sys.path and bench/store.py would shadow the
# ``store`` package: import the packages without it, then put it back for ``_longtail``.
_HERE = str(Path(__file__).resolve().parent)
sys.path[:] = [p for p in sys.path if str(Path(p or ".").resolve()) != _HERE]

import torch  # noqa: E402

from gfcr import Evaluation, Pipeline  # noqa: E402
from gfcr.launch.run import execute  # noqa: E402
from stages import GRPO, HF, GroupSample, OnlinePrune, TokenBudget, UniformSampler, Verify  # noqa: E402
import store  # noqa: E402,F401  (the package, before bench/store.py is back in reach)

sys.path.insert(0, _HERE)
from _april import CLOCKS, arms, interleaved, rates  # noqa: E402
from _longtail import MAX_TOKENS, POLICY, WARMSTART, Repeat  # noqa: E402
sys.path.remove(_HERE)  # child processes start with this sys.path (gfcr.procs.childproc)

BUDGET_SHARE = 0.5
"""TokenBudget's per-step budget as a share of the baseline's tokens per step (DUET's 50%)."""
LR = 3e-4
"""GRPO's learning rate in the savings runs: at 1e-3 this 0.1M-parameter policy collapses
within a few steps (held-out accuracy 0.70 -> 0.28 in 12 steps), at 3e-4 it holds."""


def _pipeline(stages: list[Any], *, seed: int, steps: int, warm: bool = True) -> Pipeline:
    return Pipeline(name="control-bench", seed=seed, steps=steps, task=Repeat(), policy=POLICY,
                    engine=HF(device="cpu"), warmstart=WARMSTART if warm else None,
                    stages=stages, evaluation=Evaluation(size=128, max_tokens=MAX_TOKENS))


SEGMENT = 2
"""Tokens between two looks of the in-flight hooks: APRIL stops at most this late."""


def _sample(n: int) -> GroupSample:
    return GroupSample(n=n, temperature=1.0, max_tokens=MAX_TOKENS, segment_tokens=SEGMENT)


# --------------------------------------------------------------------------- APRIL


def april_vs_sync(root: Path, *, batch: int, n: int, steps: int, repeats: int,
                  clock: str) -> dict[str, Any]:
    """Completed-rollout throughput of APRIL over synchronous generation (see module doc;
    the interleaving is bench/_april.py's)."""
    policy = POLICY.build(seed=0)
    WARMSTART.run(policy, Repeat(), seed=0, cache_dir=root / "cache")
    gains: dict[str, list[float]] = {c: [] for c in CLOCKS}
    detail, discarded = [], 0
    for r in range(repeats):
        runs = {k: _pipeline(stages, seed=r, steps=steps, warm=False)
                for k, stages in arms(_sample(n), batch).items()}
        got = interleaved(policy, runs, root / f"april-{r}", steps=steps, repeat=r)
        rate, tally = rates(got), got["arms"]
        for c in CLOCKS:
            gains[c].append(rate[c, "april"] / rate[c, "sync"] - 1)
        discarded += tally["april"]["discarded"] + tally["sync"]["discarded"]
        detail.append({**{f"{k}_rollouts_per_s_{c}": rate[c, k] for c, k in rate},
                       "sync_complete": tally["sync"]["complete"],
                       "april_complete": tally["april"]["complete"], **got["lineage"]})
    return {"april_throughput_gain": statistics.median(gains[clock]), "discarded": discarded,
            "april_gains": gains[clock], "clock": clock,
            **{f"april_throughput_gain_{c}": statistics.median(g) for c, g in gains.items()},
            "april_runs": detail}


# --------------------------------------------------------------------------- savings


def _train(root: Path, control: list[Any], seed: int, steps: int) -> dict[str, float]:
    p = _pipeline([UniformSampler(batch=8), *control, _sample(8), Verify(), GRPO(lr=LR)],
                  seed=seed, steps=steps)
    s = execute(p, root=root, executor="local")
    return {"tokens": sum(m["tokens"] for m in s.history), "accuracy": s.accuracy_after,
            "accuracy_warmstart": s.accuracy_warmstart,
            "pruned_frac": statistics.fmean(m.get("pruned_frac", 0.0) for m in s.history)}


def _equal(a: float, b: float, n: int) -> bool:
    """Whether accuracies ``a`` and ``b`` on ``n`` held-out prompts each differ by less
    than two standard errors of their difference (pooled)."""
    p = (a + b) / 2
    return abs(a - b) < 2 * math.sqrt(max(p * (1 - p), 1e-12) * 2 / n)


def savings(root: Path, *, steps: int, seeds: list[int]) -> dict[str, Any]:
    """Tokens saved by OnlinePrune and TokenBudget against plain GRPO, same seeds."""
    runs: dict[str, list[dict[str, float]]] = {"base": [], "prune": [], "budget": []}
    for seed in seeds:
        base = _train(root, [], seed, steps)
        budget = int(BUDGET_SHARE * base["tokens"] / steps)
        runs["base"].append(base)
        runs["prune"].append(_train(root, [OnlinePrune(min_tokens=4, window=4)], seed, steps))
        runs["budget"].append(_train(root, [TokenBudget(budget=budget, split="informative",
                                                        abort="prune")], seed, steps))
    total = {k: sum(r["tokens"] for r in v) for k, v in runs.items()}
    acc = {k: statistics.fmean(r["accuracy"] for r in v) for k, v in runs.items()}
    n = 128 * len(seeds)
    out: dict[str, Any] = {"train_steps": steps, "seeds": seeds, "accuracy": acc,
                           "tokens": total, "runs": runs}
    for k in ("prune", "budget"):
        out[f"{k}_token_saving"] = 1 - total[k] / total["base"]
        out[f"{k}_equal_accuracy"] = _equal(acc[k], acc["base"], n)
    return out


# --------------------------------------------------------------------------- tree slot


def tree_row(args: argparse.Namespace) -> dict[str, Any] | None:
    """TREE ROLLOUTS: distinct answers per prompt of LATR trees (8 leaves) over those of
    independent samples given the same tokens, shared prefixes counted once
    (bench/_tree.py; standalone: bench/tree.py). The warm start is the default
    pipeline's, cached under .gfcr/cache."""
    sys.path.insert(0, _HERE)
    try:
        from _tree import tree_vs_independent
    finally:
        sys.path.remove(_HERE)

    r = tree_vs_independent(seeds=tuple(args.seeds))
    t, i = r["tree"], r["independent"]
    return {"figure": "tree_distinct_ratio", "value": round(r["distinct_ratio"], 3),
            "baseline": "independent samples, same tokens",
            "note": (f"distinct/prompt {t['distinct_per_prompt']:.2f} vs "
                     f"{i['distinct_per_prompt']:.2f} at {t['tokens_per_prompt']:.1f} vs "
                     f"{i['tokens_per_prompt']:.1f} tokens; coverage {t['coverage']:.3f} vs "
                     f"{i['coverage']:.3f}")}


# --------------------------------------------------------------------------- output


def _rows(result: dict[str, Any], tree: dict[str, Any] | None) -> list[list[str]]:
    a, s = result, result["savings"]
    rows = [["april_throughput_gain", f"{a['april_throughput_gain']:+.1%}",
             "synchronous, same batch",
             f"{a['clock']} clock, repeats " + ", ".join(f"{g:+.0%}" for g in a["april_gains"])
             + f"; wall {a['april_throughput_gain_wall']:+.0%}, process "
             f"{a['april_throughput_gain_process']:+.0%}; target >= +20%"],
            ["discarded", str(a["discarded"]), "-", "must be 0"]]
    for k, name in (("prune", "OnlinePrune"), ("budget", "TokenBudget 50%")):
        rows.append([f"{k}_token_saving", f"{s[f'{k}_token_saving']:+.1%}", "plain GRPO",
                     f"{name}: accuracy {s['accuracy'][k]:.3f} vs {s['accuracy']['base']:.3f}"
                     f" ({'equal' if s[f'{k}_equal_accuracy'] else 'NOT equal'})"])
    if tree:
        rows.append([tree["figure"], str(tree["value"]), tree["baseline"], tree["note"]])
    return rows


def _print(rows: list[list[str]]) -> None:
    headers = ["figure", "value", "against", "note"]
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        for line in [headers, *rows]:
            print("\t".join(line))
        return
    table = Table(title="Control on a long-tailed workload")
    for h in headers:
        table.add_column(h)
    for line in rows:
        table.add_row(*line)
    Console().print(table)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--steps", type=int, default=12, help="APRIL/sync steps per repeat")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--train-steps", type=int, default=12)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="process",
                        help="clock of the headline gain (both are measured): process = "
                             "this process's CPU time, steadier on a shared machine")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads; 1 (default) is fastest for these tiny models "
                             "and steadiest on a shared machine")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        result = april_vs_sync(Path(tmp), batch=8, n=4, steps=args.steps,
                               repeats=args.repeats, clock=args.clock)
        result["savings"] = savings(Path(tmp), steps=args.train_steps, seeds=args.seeds)
    tree = tree_row(args)
    if tree:
        result["tree_distinct_ratio"] = tree["value"]
    result["seconds"] = time.perf_counter() - started
    result["settings"] = {"clock": args.clock, "threads": torch.get_num_threads(),
                          "steps": args.steps, "repeats": args.repeats}
    if args.json:
        sv = result["savings"]
        print(json.dumps({**result, "april_throughput_gain": round(result["april_throughput_gain"], 4),
                          "prune_token_saving": round(sv["prune_token_saving"], 4),
                          "budget_token_saving": round(sv["budget_token_saving"], 4),
                          "prune_equal_accuracy": sv["prune_equal_accuracy"],
                          "budget_equal_accuracy": sv["budget_equal_accuracy"]}, default=str))
        return
    _print(_rows(result, tree))
    print(f"{result['seconds']:.0f} s; settings: {result['settings']}")


if __name__ == "__main__":
    main()
