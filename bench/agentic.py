"""Learning to use feedback: held-out episode success of the agentic pipeline.

The agentic pipeline (pipelines/agentic.py: two tries per question, a wrong first answer
hears "wrong, try again. hint: <answer>." and the question again) from the default
pipeline's cached SFT warm start (seed 0), trained ``--steps`` steps with GRPO on the
episodes' reward, on the HF engine and on vLLM (its CPU build here), ``--seeds`` seeds
each. Held-out episode success (either try right) is measured before and after on the
task's held-out questions (the first ``--eval-size``), greedily, with the same episodes
stage on the HF engine for both (so the engines differ only in what they trained on).
The baseline is the warm start, measured in the same run; the gain is in points, its
standard error over seeds is ``sd / sqrt(seeds)``. ``second_try`` is the share of
held-out episodes with a wrong first answer that the second try got right: what reading
the feedback buys.

    .venv/bin/python bench/agentic.py                 # table
    .venv/bin/python bench/agentic.py --json          # one JSON object
    .venv/bin/python bench/agentic.py --engines hf --seeds 1 --steps 4   # a smoke run
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

_spec = importlib.util.spec_from_file_location("_runs", Path(__file__).with_name("_runs.py"))
_runs = sys.modules["_runs"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_runs)

from gfcr import Pipeline  # noqa: E402
from gfcr.core.loading import load  # noqa: E402
from stages import Episodes  # noqa: E402

ENGINES = {"hf": [], "vllm": ["engine=vllm"]}
"""Engine name -> overrides of the agentic pipeline."""


def pipeline(engine: str, seed: int, args: argparse.Namespace) -> Pipeline:
    """The agentic pipeline shrunk to the benchmark's size, from the shared warm start,
    checkpointed at its last step (the weights the held-out episodes are run with)."""
    from pipelines.agentic import pipeline as agentic

    overrides = [f"steps={args.steps}", f"seed={seed}", "evaluation.every=0",
                 "evaluation.size=16", f"checkpoint.every={args.steps}",
                 f"uniform.batch={args.batch}", f"episodes.n={args.n}",
                 f"grpo.lr={args.lr}", *ENGINES[engine]]
    data = agentic.with_overrides(overrides).to_dict()
    sft = load("default").warmstart
    if args.warm_steps:  # a shorter warm start, where the default's is too slow to train
        sft = sft.model_copy(update={"steps": args.warm_steps, "batch_size": args.warm_batch})
    data["warmstart"] = _runs.SharedWarmStart(sft=sft, cache=str(args.cache))
    return Pipeline(**{**data, "name": f"bench-agentic-{engine}"})


def heldout(p: Pipeline, weights: Path | None, eval_size: int) -> dict[str, float]:
    """Greedy held-out episodes on the HF engine with ``weights`` (None: the warm start):
    success (either try right), first-try accuracy, and the second try's success among
    the episodes whose first answer was wrong."""
    stage = next(s for s in p.stages if isinstance(s, Episodes))
    greedy = stage.model_copy(update={"n": 1, "temperature": 0.0})
    rows = _runs.heldout_rows(p, weights, greedy, p.task.heldout_prompts().slice(0, eval_size))
    first = [r for r in rows if r["turns"][1]["reward"] == 1.0]
    retried = [r for r in rows if r["n_turns"] == 2]
    return {"success": statistics.mean(float((r["reward"] or 0) > 0) for r in rows),
            "first_try": len(first) / len(rows),
            "second_try": (statistics.mean(float(r["reward"] > 0) for r in retried)
                           if retried else 0.0)}


def one_run(engine: str, seed: int, args: argparse.Namespace, root: Path) -> dict[str, Any]:
    p = pipeline(engine, seed, args)
    started = time.perf_counter()
    summary, weights = _runs.last_weights(p, root / f"{engine}-{seed}")
    after = heldout(p, weights, args.eval_size)
    history = summary.history
    return {"seed": seed, "after": after, "run_seconds": time.perf_counter() - started,
            "train_reward_first": history[0].get("reward_mean"),
            "train_reward_last": history[-1].get("reward_mean"),
            "tokens": sum(m.get("tokens", 0.0) for m in history)}


def summarise(start: dict[str, float], runs: list[dict[str, Any]]) -> dict[str, Any]:
    gains = [100.0 * (r["after"]["success"] - start["success"]) for r in runs]
    mean, sd, se = _runs.spread(gains)
    return {"gain_points": mean, "gain_sd": sd, "gain_se": se, "gains": gains,
            "success_after": statistics.mean(r["after"]["success"] for r in runs),
            "first_try_after": statistics.mean(r["after"]["first_try"] for r in runs),
            "second_try_after": statistics.mean(r["after"]["second_try"] for r in runs),
            "seconds_mean": statistics.mean(r["run_seconds"] for r in runs), "runs": runs}


def table(start: dict[str, float], out: dict[str, Any]) -> str:
    head = (f"{'engine':<8}{'success':>9}{'1st try':>9}{'2nd try':>9}{'gain (pts)':>12}"
            f"{'se':>6}  per seed")
    lines = [head, "-" * len(head),
             f"{'warm':<8}{start['success']:>9.3f}{start['first_try']:>9.3f}"
             f"{start['second_try']:>9.3f}"]
    for name, e in out.items():
        lines.append(f"{name:<8}{e['success_after']:>9.3f}{e['first_try_after']:>9.3f}"
                     f"{e['second_try_after']:>9.3f}{e['gain_points']:>+12.1f}"
                     f"{e['gain_se']:>6.1f}  {' '.join(f'{g:+.1f}' for g in e['gains'])}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--engines", default="hf,vllm", help="comma-separated: hf, vllm")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--batch", type=int, default=16, help="questions per step")
    ap.add_argument("--n", type=int, default=8, help="episodes per question")
    ap.add_argument("--lr", type=float, default=3e-5)
    ap.add_argument("--eval-size", type=int, default=256, help="held-out questions")
    ap.add_argument("--warm-steps", type=int, default=0,
                    help="SFT warm-start steps (0: the default pipeline's warm start)")
    ap.add_argument("--warm-batch", type=int, default=64, help="with --warm-steps")
    ap.add_argument("--cache", type=Path, default=Path(".gfcr/cache"), help="warm-start cache")
    ap.add_argument("--out", type=Path, help="also write the JSON object to this file")
    args = ap.parse_args()
    engines = [e for e in args.engines.split(",") if e]
    if not engines or set(engines) - set(ENGINES):
        sys.exit(f"--engines names {sorted(ENGINES)}; got {args.engines!r}")
    started = time.perf_counter()
    start = heldout(pipeline("hf", 0, args), None, args.eval_size)
    runs: dict[str, list[dict[str, Any]]] = {e: [] for e in engines}
    with tempfile.TemporaryDirectory(prefix="gfcr-agentic-") as tmp:
        for seed in range(args.seeds):
            for engine in engines:
                runs[engine].append(one_run(engine, seed, args, Path(tmp)))
                print(f"  {engine} seed {seed}: {start['success']:.3f} -> "
                      f"{runs[engine][-1]['after']['success']:.3f} "
                      f"({runs[engine][-1]['run_seconds']:.0f}s)", file=sys.stderr)
    out = {e: summarise(start, r) for e, r in runs.items()}
    result: dict[str, Any] = {"warm_start": start, "settings": _runs.settings(args),
                              "seconds": time.perf_counter() - started, **out}
    for e in engines:
        result[f"heldout_gain_{e}"] = out[e]["gain_points"]
        result[f"gain_se_{e}"] = out[e]["gain_se"]
    _runs.emit(result, args, lambda: (
        f"{table(start, out)}\n" + "; ".join(
            f"heldout_gain_{e}: {out[e]['gain_points']:+.1f} +- {out[e]['gain_se']:.1f} points"
            for e in engines) + f" ({args.seeds} seeds); {result['seconds']:.0f}s in all"))


if __name__ == "__main__":
    main()
