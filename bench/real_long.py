"""Long answers on a real model: the ``smol-long`` pipeline (SmolLM2-135M-Instruct sorting
lists of numbers and words) on the HF engine and on vLLM, three seeds each, in one
invocation.

Every run is a subprocess and starts from the same cached SFT warm start (seed 0). Per
seed and engine: held-out greedy accuracy after the warm start and after ``--steps`` GRPO
steps, on the same ``--eval-size`` held-out prompts. Figures:

- ``median_tokens`` / ``p90_tokens``: completion tokens of the rollouts the runs trained
  on (sampled at the pipeline's temperature, every run, every step): the lengths the
  operators act on; ``eval_median_tokens`` / ``eval_p90_tokens``: of the greedy held-out
  completions after the warm start;
- ``base_accuracy``: held-out accuracy after the warm start (mean over runs);
  ``raw_accuracy``: of the model before it;
- ``heldout_gain_hf`` / ``heldout_gain_vllm``: accuracy after the last step minus after
  the warm start, in points, mean over seeds; ``gain_se_*``: its standard error from the
  seeds' spread; ``paired_se_*``: the standard error of the per-prompt differences pooled
  over seeds (the held-out prompts' noise);
- per run: the per-step reward, length and time.

Honest method: choose the learning rate, advantage and step count with ``--validate``
(the same runs on another task seed, whose training and held-out prompts are its own, the
held-out ones the validation split; with ``--every`` the validation curve; the warm start
is the reported runs' own, trained on task seed 0), then report task seed 0's held-out
prompts, which chose nothing. The pipeline's recipe (Dr. GRPO at lr 1e-5, ListOrder's
reward, 16 steps of 16 prompts) was chosen this way; ``--set`` tries any other override
(BENCHMARKS.md, "Long answers on SmolLM2", says what was tried).

    nice -n 10 .venv/bin/python bench/real_long.py --json --out /tmp/long.json
    .venv/bin/python bench/real_long.py --seeds 1 --steps 2 --eval-size 16    # a smoke run
    .venv/bin/python bench/real_long.py --validate --engines hf --seeds 1 --eval-size 128 \
        --steps 16 --every 8 --set verify.scorer=task        # validation, the exact reward
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

_spec = importlib.util.spec_from_file_location("_runs", Path(__file__).with_name("_runs.py"))
_runs = sys.modules["_runs"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_runs)  # bench/_runs.py by path: this folder is off sys.path

HERE = Path(__file__).resolve()
VALIDATION_TASK_SEED = 1
"""``--validate`` runs on this task seed: other training prompts, other held-out prompts."""


def _args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--out", type=Path, help="also write the JSON object here (after each run)")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=None, help="default: the pipeline's")
    ap.add_argument("--lr", type=float, default=None, help="default: the pipeline's")
    ap.add_argument("--advantage", default=None,
                    help="GRPO's advantage estimator (grpo, drgrpo, ...); default: the pipeline's")
    ap.add_argument("--eval-size", type=int, default=256)
    ap.add_argument("--every", type=int, default=0,
                    help="also evaluate every N steps (the validation curve)")
    ap.add_argument("--engines", default="hf,vllm")
    ap.add_argument("--jobs", type=int, default=1,
                    help="runs at a time, each its own subprocess; keep 1 on a 2-core machine: "
                         "two vLLM runs at once took 139 s a step each, one alone 30 s")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a further override of the pipeline (e.g. verify.scorer=module:fn), "
                         "after the vLLM runs' engine=vllm: an engine.* is the run's engine's")
    ap.add_argument("--validate", action="store_true",
                    help=f"task seed {VALIDATION_TASK_SEED}: the validation split")
    ap.add_argument("--models", type=Path, default=Path(".gfcr"),
                    help="run root whose cache holds the converted model")
    ap.add_argument("--cache", type=Path, default=Path(".gfcr/cache"), help="warm-start cache")
    ap.add_argument("--arm", choices=sorted(ARMS), default="grpo",
                    help="smol-long as it is (grpo) or with an operator (bench/effects.py)")
    ap.add_argument("--one", choices=["hf", "vllm"], help=argparse.SUPPRESS)
    ap.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    return ap.parse_args(argv)


# --------------------------------------------------------------------------- arms

OVERLONG_BUFFER = 32
"""DAPO's soft overlong punishment ramps to -1 over the last 32 of the 128 tokens."""
ARMS = {"grpo": "smol-long as it is",
        "overlong": "+ Overlong(mode='penalty', buffer=32) after the verifier (DAPO, 3.4)",
        "prune": "+ OnlinePrune before the generate stage, looking every 8 tokens (ARRoL)",
        "tree": "TreeRollout's leaves (LATR) instead of independent samples"}
"""``--arm``: the stage lists bench/effects.py sets side by side, each otherwise smol-long."""


def arm_stages(stages: list[dict[str, Any]], arm: str) -> list[dict[str, Any]]:
    """smol-long's stage list (as dicts) with ``arm``'s operator (:data:`ARMS`)."""
    from stages import OnlinePrune, Overlong, TreeRollout

    at = {s["type"]: i for i, s in enumerate(stages)}
    g, v = at["group"], at["verify"]
    group = stages[g]
    if arm == "overlong":
        shaping = Overlong(mode="penalty", max_tokens=group["max_tokens"], buffer=OVERLONG_BUFFER)
        return [*stages[:v + 1], shaping.model_dump(), *stages[v + 1:]]
    if arm == "prune":
        prune = OnlinePrune(max_prune=0.5, min_tokens=8, margin=0.25, window=4)
        return [*stages[:g], prune.model_dump(), {**group, "segment_tokens": 8}, *stages[g + 1:]]
    if arm == "tree":
        tree = TreeRollout(n=group["n"], temperature=group["temperature"],
                           max_tokens=group["max_tokens"], branch_prob=0.2, lookahead=4,
                           min_distance=0.4)
        return [*stages[:g], tree.model_dump(), *stages[g + 1:]]
    return stages


# --------------------------------------------------------------------------- one run


def _pipeline(args: argparse.Namespace, engine: str) -> Any:
    from gfcr import Pipeline
    from gfcr.core.loading import load
    from stages import SFT

    base = load("smol-long")
    sets = [f"seed={args.seed}", f"evaluation.every={args.every}",
            f"evaluation.size={args.eval_size}", "checkpoint.every=0",
            f"policy.root={args.models}"]
    if args.steps is not None:
        sets.append(f"steps={args.steps}")
    if args.lr is not None:
        sets.append(f"grpo.lr={args.lr}")
    if args.advantage is not None:
        sets.append(f"grpo.advantage={args.advantage}")
    if args.validate:
        sets.append(f"task.seed={VALIDATION_TASK_SEED}")
    if engine == "vllm":  # before --set, so that a --set engine.* is the run's engine's
        sets += ["engine=vllm", "engine.max_model_len=1024"]
    sets += args.set
    data = base.with_overrides(sets).to_dict()
    data["stages"] = arm_stages(data["stages"], args.arm)
    sft = base.warmstart
    assert isinstance(sft, SFT)
    data["warmstart"] = _runs.SharedWarmStart(sft=sft, cache=str(args.cache),
                                              task_seed=base.task.seed)
    return Pipeline(**{**data, "name": f"bench-smol-long-{args.arm}-{engine}"})


def run_one(args: argparse.Namespace, engine: str) -> dict[str, Any]:
    """One seed of smol-long on ``engine``, in this process: accuracies, lengths, curve."""
    from gfcr.launch.run import execute
    from store import RolloutStore

    pipeline = _pipeline(args, engine)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gfcr-long-") as tmp:
        summary = execute(pipeline, root=Path(tmp), executor="local")
        with RolloutStore.open(summary.store, read_only=True) as lake:
            lengths = lake.sql("SELECT len(completion_ids) AS n FROM rollouts").column(
                "n").to_pylist()
            by_step = lake.sql("SELECT avg(n_tokens) AS n FROM rollouts WHERE status = "
                               "'complete' GROUP BY step ORDER BY step").column("n").to_pylist()
            evals = lake.sql(
                "SELECT label, prompt_id, n_tokens, correct FROM eval_completions "
                "WHERE eval_set = 'heldout' AND temperature = 0").to_pylist()
    hist = summary.history
    warm = summary.accuracy_warmstart  # None: no evaluation before the warm start
    return {"engine": engine, "seed": args.seed,
            "accuracy_raw": None if warm is None else summary.accuracy_before,
            "accuracy_start": summary.accuracy_before if warm is None else warm,
            "accuracy_final": summary.accuracy_after,
            "curve": [(i + 1, m["heldout_accuracy"]) for i, m in enumerate(hist)
                      if "heldout_accuracy" in m],
            "lengths": lengths, "evals": _by_label(evals), "step_lengths": by_step,
            "tokens": [m.get("tokens", 0.0) for m in hist],
            "step_seconds": [m.get("step_seconds", 0.0) for m in hist],
            "reward_mean": [m.get("train/reward_mean", 0.0) for m in hist],
            "run_seconds": time.perf_counter() - started}


def _by_label(rows: list[dict[str, Any]]) -> dict[str, dict[str, list[Any]]]:
    """Greedy held-out completions per evaluation label: prompt ids, tokens, correct."""
    out: dict[str, dict[str, list[Any]]] = {}
    for r in sorted(rows, key=lambda r: (r["label"], r["prompt_id"])):
        got = out.setdefault(r["label"], {"prompt_id": [], "n_tokens": [], "correct": []})
        for key in got:
            got[key].append(r[key])
    return out


# --------------------------------------------------------------------------- all runs


def _quantile(values: list[int], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return float(ordered[min(len(ordered) - 1, int(q * len(ordered)))])


def _paired_se(runs: list[dict[str, Any]]) -> float | None:
    """Standard error of the per-prompt (after - start) differences, in points, pooled
    over the runs: each run's first and last greedy evaluation of the same prompts."""
    diffs: list[float] = []
    for r in runs:
        evals = _runs.ordered_evals(r["evals"])
        start = evals[1 if evals[0][0] == "initial" else 0][1]
        diffs += _runs.prompt_diffs(evals[-1][1], start)
    return _runs.mean_se(diffs)[1]


def summarise(runs: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    by = {e: [r for r in runs if r["engine"] == e] for e in ("hf", "vllm")}
    lengths = [n for r in runs for n in r["lengths"]]
    warm_eval = [n for r in runs for label, ev in r["evals"].items() if label == "step=0"
                 for n in ev["n_tokens"]]
    out: dict[str, Any] = {
        "median_tokens": _quantile(lengths, 0.5), "p90_tokens": _quantile(lengths, 0.9),
        "eval_median_tokens": _quantile(warm_eval, 0.5),
        "eval_p90_tokens": _quantile(warm_eval, 0.9),
        "base_accuracy": _mean([r["accuracy_start"] for r in runs]),
        "raw_accuracy": _mean([r["accuracy_raw"] for r in runs]),
        "validation": args.validate,
        "settings": {k: str(v) for k, v in vars(args).items()
                     if k not in ("json", "out", "one", "seed")}}
    for e in ("hf", "vllm"):
        gains = [100.0 * (r["accuracy_final"] - r["accuracy_start"]) for r in by[e]]
        out[f"heldout_gain_{e}"], out[f"gain_se_{e}"] = _runs.mean_se(gains)
        out[f"paired_se_{e}"] = _paired_se(by[e])
    out["runs"] = [{k: v for k, v in r.items() if k not in ("lengths", "evals")} for r in runs]
    return out


def _mean(values: list[float | None]) -> float | None:
    got = [v for v in values if v is not None]
    return statistics.fmean(got) if got else None


def _pct(value: float | None) -> str:
    return "not evaluated" if value is None else f"{value:.1%}"


def table(result: dict[str, Any]) -> str:
    lines = [f"completion tokens (training rollouts): median {result['median_tokens']}, "
             f"p90 {result['p90_tokens']}",
             f"held-out accuracy after the warm start: {result['base_accuracy']:.1%} "
             f"(before it: {_pct(result['raw_accuracy'])})",
             f"{'engine':<8}{'gain (points)':>15}{'se (seeds)':>12}{'se (paired)':>13}"]
    for e in ("hf", "vllm"):
        if result[f"heldout_gain_{e}"] is not None:
            se, paired = result[f"gain_se_{e}"], result[f"paired_se_{e}"]
            lines.append(f"{e:<8}{result[f'heldout_gain_{e}']:>+15.2f}"
                         f"{se if se is not None else float('nan'):>12.2f}"
                         f"{paired if paired is not None else float('nan'):>13.2f}")
    return "\n".join(lines)


def main() -> None:
    args = _args()
    if args.one:
        print(json.dumps(run_one(args, args.one)))
        return
    engines = [e for e in args.engines.split(",") if e]
    todo = [(seed, engine) for seed in range(args.seeds) for engine in engines]
    runs: list[dict[str, Any]] = []
    with ThreadPoolExecutor(args.jobs) as pool:  # each run is its own subprocess
        pending = [pool.submit(_runs.rerun, HERE, engine, seed) for seed, engine in todo]
        for done in as_completed(pending):
            r = done.result()
            runs.append(r)
            runs.sort(key=lambda r: (r["seed"], engines.index(r["engine"])))
            print(f"  {r['engine']} seed {r['seed']}: {r['accuracy_start']:.3f} -> "
                  f"{r['accuracy_final']:.3f} curve {r['curve']} ({r['run_seconds']:.0f} s)",
                  file=sys.stderr)
            if args.out:
                args.out.write_text(json.dumps(summarise(runs, args)))
    result = summarise(runs, args)
    print(json.dumps(result) if args.json else table(result))


if __name__ == "__main__":
    main()
