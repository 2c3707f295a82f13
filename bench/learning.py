"""Learning on held-out data: the GRPO family on the default task, three seeds each.

Every configuration is the default pipeline (pipelines/default.py) with a few stages
changed, started from the same cached SFT warm start (seed 0) and run for ``--steps``
steps (40, as the default pipeline) in-process, with held-out greedy accuracy
(``--eval-size`` held-out prompts) measured after the warm start, every ``--every`` (10)
steps and at the end:

- ``grpo``: the default (group mean/std advantage, sequence-mean loss, G=8);
- ``drgrpo``: Dr. GRPO (Liu et al. 2025): mean-only advantage, token sums divided by the
  generation budget (``seq_mean_token_sum_norm``);
- ``dapo``: DAPO-style (Yu et al. 2025): token-mean loss, clip-higher 0.28, dynamic
  sampling refilling the batch to 32 groups with signal;
- ``mc_grpo_g2``: MC-GRPO's setting: G=2+1 samples, median baseline, the pivot dropped;
- ``grpo_g2``: GRPO at G=2, the comparison MC-GRPO's paper makes (G=2 vs G=8 gap);
- ``random_reward``: the control: GRPO as the default, but the reward is a coin flip per
  (prompt, completion) that ignores correctness (``_runs.random_reward``), so what it gains
  is what the update gains without the verifier's signal (sharpening, clipping bias);
- ``vllm``: the default (grpo) on the vLLM engine (``engine=vllm``; vLLM's CPU build here)
  instead of the HF one: same stages, same warm start, its gain should be within noise.

Seeds change prompt draws and sampling, not the warm start. ``grpo_heldout_gain`` is the
grpo configuration's held-out accuracy after its last step minus after the warm start, in
points, mean over seeds; every configuration has the same figure and its curve. When both
``grpo`` (the HF engine) and ``vllm`` ran, ``vllm_vs_hf`` compares their gains: the
difference of the means with its standard error (from the seeds' spreads), the per-seed
differences, and whether the difference is within two standard errors.

    .venv/bin/python bench/learning.py                               # table
    .venv/bin/python bench/learning.py --json                        # one JSON object
    .venv/bin/python bench/learning.py --configs grpo,vllm --json    # HF vs vLLM engine
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from pathlib import Path
from typing import Any

# Run as a script, this folder comes first on sys.path and bench/store.py would shadow
# the ``store`` package; drop that entry before anything imports it.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

_spec = importlib.util.spec_from_file_location("_runs", Path(__file__).with_name("_runs.py"))
_runs = sys.modules["_runs"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_runs)

from gfcr.core.loading import load  # noqa: E402

CONFIGS: dict[str, list[str]] = {
    "grpo": [],
    "drgrpo": ["grpo.advantage=drgrpo", "grpo.aggregation=seq_mean_token_sum_norm"],
    "dapo": ["grpo.aggregation=token_mean", "grpo.clip_high=0.28",
             "dynamic_sampling.mode=refill", "dynamic_sampling.min_groups=32",
             "dynamic_sampling.max_rounds=3"],
    "mc_grpo_g2": ["group.n=3", "grpo.advantage=mc_grpo"],
    "grpo_g2": ["group.n=2"],
    "random_reward": ["verify.scorer=_runs:random_reward"],
    "vllm": ["engine=vllm"],
}
"""Configuration name -> ``--set`` overrides of the default pipeline."""


def one_run(name: str, seed: int, args: argparse.Namespace, root: Path) -> dict[str, Any]:
    """One configuration and seed: its curve and gain over the warm start, in points."""
    lr = [f"grpo.lr={args.lr}"] if args.lr else []
    pipeline = _runs.shrunk(load("default"), name, seed, CONFIGS[name] + lr, steps=args.steps,
                            every=args.every, eval_size=args.eval_size, cache=args.cache)
    run = _runs.run_curve(pipeline, root / f"{name}-{seed}")
    history = run["history"]
    return {"seed": seed, "curve": run["curve"], "accuracy_start": run["accuracy_start"],
            "accuracy_final": run["accuracy_final"],
            "gain_points": 100.0 * (run["accuracy_final"] - run["accuracy_start"]),
            "train_reward_first": _mean_of(history[:5], "reward_mean"),
            "train_reward_last": _mean_of(history[-5:], "reward_mean"),
            "tokens": sum(m.get("tokens", 0.0) for m in history),
            "run_seconds": run["run_seconds"]}


def _mean_of(rows: list[dict[str, float]], key: str) -> float | None:
    values = [m[key] for m in rows if key in m]
    return statistics.mean(values) if values else None


def summarise(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per configuration: mean and spread of the gain, and the mean curve over seeds."""
    out: dict[str, Any] = {}
    for name, seeds in runs.items():
        gains = [r["gain_points"] for r in seeds]
        steps = [s for s, _ in seeds[0]["curve"]]
        out[name] = {
            "seeds": len(seeds), "gain_points_mean": statistics.mean(gains),
            "gain_points_sd": statistics.stdev(gains) if len(gains) > 1 else 0.0,
            "accuracy_start_mean": statistics.mean(r["accuracy_start"] for r in seeds),
            "accuracy_final_mean": statistics.mean(r["accuracy_final"] for r in seeds),
            "curve_mean": [(s, statistics.mean(r["curve"][i][1] for r in seeds))
                           for i, s in enumerate(steps)],
            "tokens_mean": statistics.mean(r["tokens"] for r in seeds),
            "runs": seeds}
    return out


def engine_comparison(summary: dict[str, Any]) -> dict[str, Any] | None:
    """The vLLM engine's gain against the HF engine's (``vllm`` minus ``grpo``), in points:
    difference of the means, its standard error sqrt(sd_v^2/n_v + sd_h^2/n_h), the
    differences seed by seed (same seed: same prompt draws and warm start, sampling from
    each engine's own generator), and ``within_noise`` (|difference| <= 2 standard
    errors). None unless both configurations ran."""
    hf, vl = summary.get("grpo"), summary.get("vllm")
    if hf is None or vl is None:
        return None
    diff = vl["gain_points_mean"] - hf["gain_points_mean"]
    se = (vl["gain_points_sd"] ** 2 / vl["seeds"] + hf["gain_points_sd"] ** 2 / hf["seeds"]) ** 0.5
    per_seed = [v["gain_points"] - h["gain_points"] for v, h in zip(vl["runs"], hf["runs"])]
    return {"hf_gain_points": hf["gain_points_mean"], "hf_gain_sd": hf["gain_points_sd"],
            "vllm_gain_points": vl["gain_points_mean"], "vllm_gain_sd": vl["gain_points_sd"],
            "difference_points": diff, "difference_se": se, "per_seed_difference": per_seed,
            "within_noise": abs(diff) <= 2 * se if se > 0 else diff == 0}


def _comparison_line(c: dict[str, Any] | None) -> str:
    if c is None:
        return ""
    return (f"\nvllm_vs_hf: gain {c['vllm_gain_points']:+.1f} +- {c['vllm_gain_sd']:.1f} (vLLM) vs "
            f"{c['hf_gain_points']:+.1f} +- {c['hf_gain_sd']:.1f} (HF) points; difference "
            f"{c['difference_points']:+.1f} +- {c['difference_se']:.1f} (per seed "
            f"{' '.join(f'{d:+.1f}' for d in c['per_seed_difference'])}); "
            f"within noise: {c['within_noise']}")


def table(summary: dict[str, Any]) -> str:
    """The comparison as a plain-text table; curves as accuracy at each evaluated step."""
    head = (f"{'configuration':<14}{'start':>7}{'final':>7}{'gain (pts)':>12}{'sd':>6}"
            f"{'tokens':>10}  curve (step: accuracy, mean over seeds)")
    lines = [head, "-" * len(head)]
    for name, e in summary.items():
        curve = " ".join(f"{s}:{a:.3f}" for s, a in e["curve_mean"])
        lines.append(f"{name:<14}{e['accuracy_start_mean']:>7.3f}{e['accuracy_final_mean']:>7.3f}"
                     f"{e['gain_points_mean']:>+12.1f}{e['gain_points_sd']:>6.1f}"
                     f"{e['tokens_mean']:>10,.0f}  {curve}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    _runs.add_common_args(ap, list(CONFIGS), steps=40, every=10)
    args = ap.parse_args()
    names = _runs.config_names(args, list(CONFIGS), baseline=False)
    started = time.perf_counter()
    runs = _runs.all_runs(names, args.seeds, lambda n, seed, root: one_run(n, seed, args, root),
                          prefix="gfcr-learning-")
    summary = summarise(runs)
    comparison = engine_comparison(summary)
    result = {"grpo_heldout_gain": summary.get("grpo", {}).get("gain_points_mean"),
              "vllm_vs_hf": comparison, "settings": _runs.settings(args), "seconds": time.perf_counter() - started,
              **summary}
    _runs.emit(result, args, lambda: (
        f"{table(summary)}\ngrpo_heldout_gain: {result['grpo_heldout_gain'] or 0:+.1f} points "
        f"(mean over {args.seeds} seeds); {result['seconds']:.0f}s in all"
        f"{_comparison_line(comparison)}"))


if __name__ == "__main__":
    main()
