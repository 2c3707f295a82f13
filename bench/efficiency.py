"""Sample efficiency of replay and data selection against plain GRPO, on the default task.

For plain GRPO (pipelines/default.py) and the ready pipelines rollout_replay, dots_rr,
insight and vade, three seeds each, all in this one run: generated tokens and training
wall time until held-out greedy accuracy first reaches the warm start's accuracy plus
``--gain`` points. Every run starts from the same weights: the default pipeline's SFT
warm start with seed 0, cached under ``--cache`` (the default run root's cache, so
``gfcr run`` makes it free; otherwise the first run trains it once). Seeds change prompt
draws and sampling only; every pipeline keeps its own stages and GRPO settings (they all
use the default's learning rate).

Shrunk so the whole script fits in about 30 minutes on 2 idle CPU cores: ``--steps``
(30 instead of the pipelines' 40-60), held-out evaluation every ``--every`` (5) steps on
the task's held-out prompts (``--eval-size``, 512). A generated token is one the engine
produced in that run: replayed rows count nothing (the loop's ``tokens`` metric of each
step). Wall time is the sum of step times up to the crossing (evaluations excluded). A
seed that never reaches the threshold is censored; a configuration's figure is the median
over its seeds, so it is reported only when at least two of three seeds reached the
threshold.

``--gain`` 3 points: with 512 held-out prompts one binomial standard error of the
accuracy is about 1.8 points near the warm start's 78%, so crossings are noisy: read the
savings with the accuracy columns beside them. (Until 2026-11-21 the default task was
two-term 1-2 digit sums, on which plain GRPO gained nothing to measure against.)

    .venv/bin/python bench/efficiency.py            # table
    .venv/bin/python bench/efficiency.py --json     # one JSON object

``best_token_saving`` is ``1 - tokens(config) / tokens(grpo)`` of the best configuration
(the target is at least 0.25); ``configurations`` has one entry per configuration.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

# Run as a script, this folder comes first on sys.path and bench/store.py would shadow
# the ``store`` package; drop that entry before anything imports it.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import importlib.util  # noqa: E402

_spec = importlib.util.spec_from_file_location("_runs", Path(__file__).with_name("_runs.py"))
_runs = sys.modules["_runs"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_runs)

from gfcr.core.loading import load  # noqa: E402

CONFIGS = {"grpo": "default", "rollout_replay": "rollout_replay", "dots_rr": "dots_rr",
           "insight": "insight", "vade": "vade"}
"""Configuration name -> registered pipeline; "grpo" is the baseline."""


def one_run(name: str, seed: int, args: argparse.Namespace, root: Path) -> dict[str, Any]:
    """Run one configuration and seed; its accuracy curve and cost to the threshold."""
    pipeline = _runs.shrunk(load(CONFIGS[name]), name, seed,
                            [f"grpo.lr={args.lr}"] if args.lr else [], steps=args.steps,
                            every=args.every, eval_size=args.eval_size, cache=args.cache)
    run = _runs.run_curve(pipeline, root / f"{name}-{seed}")
    generated = [m["tokens"] for m in run["history"]]
    seconds = [m["step_seconds"] for m in run["history"]]
    threshold = run["accuracy_start"] + args.gain / 100.0
    crossing = next((s for s, acc in run["curve"] if s > 0 and acc >= threshold), None)
    return {"seed": seed, "reached_at_step": crossing,
            "tokens_to_threshold": None if crossing is None else sum(generated[:crossing]),
            "seconds_to_threshold": None if crossing is None else sum(seconds[:crossing]),
            "tokens_total": sum(generated),
            "replayed_rows": sum(m.get("replay/rows", 0.0) for m in run["history"]),
            "accuracy_start": run["accuracy_start"], "accuracy_final": run["accuracy_final"],
            "curve": run["curve"],
            "run_seconds": run["run_seconds"]}


def median_or_none(values: list[float | None]) -> float | None:
    """Median with unreached seeds as +inf; None when it is not finite."""
    m = statistics.median([float("inf") if v is None else v for v in values])
    return None if m == float("inf") else m


def summarise(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per-configuration medians and savings relative to "grpo"."""
    out: dict[str, Any] = {}
    for name, seeds in runs.items():
        out[name] = {
            "reached": sum(r["reached_at_step"] is not None for r in seeds), "seeds": len(seeds),
            "tokens_to_threshold": median_or_none([r["tokens_to_threshold"] for r in seeds]),
            "seconds_to_threshold": median_or_none([r["seconds_to_threshold"] for r in seeds]),
            "accuracy_final_mean": statistics.mean(r["accuracy_final"] for r in seeds),
            "accuracy_peak_mean": statistics.mean(max(a for s, a in r["curve"] if s > 0) for r in seeds),
            "tokens_total_mean": statistics.mean(r["tokens_total"] for r in seeds),
            "runs": seeds}
    base = out.get("grpo", {})
    for name, entry in out.items():
        for key, saving in (("tokens_to_threshold", "token_saving"), ("seconds_to_threshold", "time_saving")):
            mine, theirs = entry[key], base.get(key)
            entry[saving] = None if mine is None or not theirs else 1.0 - mine / theirs
    return out


def table(summary: dict[str, Any], gain: float) -> str:
    """The comparison as a plain-text table."""
    def fmt(v: Any, spec: str) -> str:
        width = int("".join(c for c in spec.split(",")[0].split(".")[0] if c.isdigit()) or 0)
        return "-".rjust(width) if v is None else format(v, spec)
    head = (f"{'configuration':<16}{'reached':>8}{'tokens to acc':>15}{'saving':>8}"
            f"{'secs to acc':>12}{'saving':>8}{'final acc':>10}{'peak acc':>9}{'tokens/run':>11}")
    lines = [f"held-out accuracy threshold: warm start + {gain:g} points (medians over seeds)",
             head, "-" * len(head)]
    for name, e in summary.items():
        lines.append(f"{name:<16}{e['reached']:>5}/{e['seeds']:<2}{fmt(e['tokens_to_threshold'], '15,.0f')}"
                     f"{fmt(e['token_saving'], '8.0%')}{fmt(e['seconds_to_threshold'], '12.1f')}"
                     f"{fmt(e['time_saving'], '8.0%')}{e['accuracy_final_mean']:>10.3f}"
                     f"{e['accuracy_peak_mean']:>9.3f}"
                     f"{e['tokens_total_mean']:>11,.0f}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    _runs.add_common_args(ap, list(CONFIGS), steps=30, every=5)
    ap.add_argument("--gain", type=float, default=3.0,
                    help="points above the warm start's held-out accuracy to reach")
    args = ap.parse_args()
    names = _runs.config_names(args, list(CONFIGS))
    started = time.perf_counter()
    runs = _runs.all_runs(names, args.seeds, lambda n, seed, root: one_run(n, seed, args, root),
                          prefix="gfcr-efficiency-")
    summary = summarise(runs)
    savings = [e["token_saving"] for n, e in summary.items() if n != "grpo" and e["token_saving"] is not None]
    best = max(savings) if savings else None
    result = {"best_token_saving": best, "gain_points": args.gain,
              "settings": _runs.settings(args), "seconds": time.perf_counter() - started,
              "configurations": summary}
    _runs.emit(result, args, lambda: (
        f"{table(summary, args.gain)}\nbest token saving: "
        f"{'-' if best is None else f'{best:.0%}'} (target >= 25%); "
        f"{result['seconds']:.0f}s in all"))


if __name__ == "__main__":
    main()
