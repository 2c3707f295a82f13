"""Published rollout effects on a real model (issue 32, item 3): each operator measured on
SmolLM2-135M-Instruct side by side with its baseline in this one invocation, as a ratio
(or a difference) with its standard error over seeds.

- ``april``: APRIL (Zhou et al. 2025, active partial rollouts) against synchronous
  generation of the same batch (8 groups of 4) on ``smol-long``'s long-tailed answers:
  both arms interleaved step by step on one warm-started policy in this process, the
  order alternating (bench/_april.py; no update, so both see the same weights).
  ``april_throughput_ratio``: completed rollouts per second of generation (this
  process's CPU clock; the wall clock's beside it), APRIL over synchronous;
  ``april_step_time_ratio``: the mean wall time of a step (generation, scoring, the
  store's commit). Standard errors over ``--repeats``.
- ``overlong``, ``prune``, ``tree``: ``smol-long`` trained ``--steps`` GRPO steps (its own
  16 by default, the recipe that gains on held-out prompts) as it is and with the
  operator (bench/real_long.py ``--arm``), same seeds (so the same prompts each step) and
  the same cached warm start, on ``--engine`` (HF by default), each run a subprocess.
  ``overlong_length_ratio``: mean sampled completion tokens over the second half of the
  steps, with DAPO's soft overlong punishment over without; ``overlong_eval_length_ratio``
  the same for the greedy held-out answers after training; ``overlong_accuracy_diff``:
  held-out accuracy after training, with minus without, in points.
  ``prune_token_ratio`` / ``tree_token_ratio``: tokens generated in the run (the loop's
  ``tokens``: pruned work included, a tree's shared prefix counted once) with ARRoL's
  online pruning (OnlinePrune) or LATR's tree (TreeRollout) over without;
  ``*_accuracy_diff`` as above, ``*_equal_accuracy`` whether that difference is within two
  standard errors of the per-prompt differences; ``*_tokens_per_gain_ratio``: tokens per
  point of held-out gain (after minus after the warm start), operator over baseline,
  only where both gained on every seed (otherwise None, and the note says so).
- ``gigpo``: GiGPO (Feng et al. 2025) step-level advantages against plain GRPO on the
  ``smol-agent`` pipeline (SmolLM2 with a Python tool; bench/agentic_real.py
  ``--advantage``): ``gigpo_gain_ratio``, held-out episode success gain over the warm
  start, GiGPO's over GRPO's, per seed; ``gigpo_success_diff`` in points.

Every ratio is averaged over seeds (``<key>``) with its standard error ``sd / sqrt(seeds)``
(``<key>_se``; None for one seed). ``paper`` holds each paper's headline beside ours.
The held-out prompts are the task's own (smol-long: 256 held out; smol-agent: the test
half, 256-511), never used to choose anything here.

Cost on this 2-core machine, one run at a time (a GRPO step of smol-long's 16 prompts x 4
on the HF engine 67-108 s, an evaluation of 256 prompts about 5 minutes): the defaults are
about 9 hours, the smol-long arms 8 of them (APRIL half an hour, GiGPO one hour);
``--engine vllm`` runs those arms on vLLM's CPU build (a plain run 12-21 minutes, with
the overlong penalty 15-23, pruning 17-27, trees 29-43: their segments prefill again; 3
seeds 3.5-6 hours), ``--only`` picks effects,
``--smoke`` checks the wiring in about 20 minutes (after the warm starts are cached).
``--out`` is written after every run, ``--resume`` goes on from it (BENCHMARKS.md's 3-seed
vLLM run outlasts a sitting: bench/results/effects-long-vllm.json holds its runs).

    nice -n 10 .venv/bin/python bench/effects.py --json --out /tmp/effects.json
    F=bench/results/effects-long-vllm.json; nice -n 10 .venv/bin/python bench/effects.py \
        --only overlong,prune,tree --engine vllm --resume $F --out $F --json
    .venv/bin/python bench/effects.py --only april --repeats 3 --json
    .venv/bin/python bench/effects.py --smoke
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

_spec = importlib.util.spec_from_file_location("_runs", Path(__file__).with_name("_runs.py"))
_runs = sys.modules["_runs"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_runs)  # bench/_runs.py by path: this folder is off sys.path

HERE = Path(__file__).resolve()
EFFECTS = ("april", "overlong", "prune", "tree", "gigpo")
PAPER = {
    "april": "APRIL: rollout throughput +22.5% on average (at most +44%), accuracy +2.1% "
             "on average (GRPO, DAPO, GSPO)",
    "overlong": "DAPO 3.4: soft overlong punishment stabilises training (no figure for it "
                "alone in METHODS.md)",
    "prune": "ARRoL: up to 1.7x training speedup, +2.3 to +3.0 average accuracy",
    "tree": "LATR: policy learning 131% faster on average, +4.2% pass@1 vs stochastic sampling",
    "gigpo": "GiGPO: > 12% ALFWorld and > 9% WebShop over GRPO (Qwen2.5-1.5B-Instruct)",
}
"""Each paper's headline (shared/METHODS.md), printed beside our figure."""
SMOKE = {"seeds": 1, "steps": 1, "eval_size": 8, "repeats": 1, "april_steps": 2,
         "agent_steps": 1, "agent_eval_size": 4}
"""What ``--smoke`` sets: a wiring check, not a measurement."""


def _args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--out", type=Path, help="also write the JSON object here (after each run)")
    ap.add_argument("--resume", type=Path,
                    help="an earlier --out with the same smol-long settings: its runs are "
                         "kept, only the (arm, seed) runs it lacks run")
    ap.add_argument("--only", default=",".join(EFFECTS), help="comma-separated effects")
    ap.add_argument("--seeds", type=int, default=3, help="training seeds per arm")
    ap.add_argument("--steps", type=int, default=None,
                    help="smol-long GRPO steps per arm (default: the pipeline's)")
    ap.add_argument("--engine", choices=["hf", "vllm"], default="hf",
                    help="the smol-long arms' engine (APRIL and GiGPO run on HF)")
    ap.add_argument("--eval-size", type=int, default=256, help="smol-long held-out prompts")
    ap.add_argument("--repeats", type=int, default=3, help="APRIL: interleaved repeats")
    ap.add_argument("--april-steps", type=int, default=4, help="APRIL: steps per repeat")
    ap.add_argument("--agent-steps", type=int, default=8, help="smol-agent GRPO steps per arm")
    ap.add_argument("--agent-eval-size", type=int, default=256, help="smol-agent test prompts")
    ap.add_argument("--smoke", action="store_true", help=f"a wiring check: {SMOKE}")
    ap.add_argument("--models", type=Path, default=Path(".gfcr"),
                    help="run root whose cache holds the converted model")
    ap.add_argument("--cache", type=Path, default=Path(".gfcr/cache"), help="warm-start cache")
    args = ap.parse_args(argv)
    if args.smoke:
        for key, value in SMOKE.items():
            setattr(args, key, value)
    unknown = sorted(set(args.only.split(",")) - set(EFFECTS))
    if unknown:
        ap.error(f"--only names unknown effects {unknown}; known: {list(EFFECTS)}")
    return args


# --------------------------------------------------------------------------- APRIL


def april(args: argparse.Namespace) -> dict[str, Any]:
    """APRIL against synchronous generation on smol-long's warm start (module doc)."""
    from gfcr import Pipeline
    from gfcr.core.loading import load
    from stages import GroupSample

    interleave = _runs.sibling("_april")
    base = load("smol-long").with_overrides([f"policy.root={args.models}"])
    policy = base.policy.build(seed=0)
    _runs.SharedWarmStart(sft=base.warmstart, cache=str(args.cache)).run(
        policy, base.task, seed=0, cache_dir=args.cache)
    group = next(s for s in base.stages if isinstance(s, GroupSample))
    throughput: dict[str, list[float]] = {c: [] for c in interleave.CLOCKS}
    step_time, repeats = [], []
    with tempfile.TemporaryDirectory(prefix="gfcr-effects-april-") as tmp:
        for r in range(args.repeats):
            runs = {k: Pipeline(name=f"effects-april-{k}", seed=r, steps=args.april_steps,
                                task=base.task, policy=base.policy, engine=base.engine,
                                stages=stages)
                    for k, stages in interleave.arms(group, 8).items()}
            got = interleave.interleaved(policy, runs, Path(tmp) / f"r{r}",
                                         steps=args.april_steps, repeat=r)
            rate = interleave.rates(got)
            for c in throughput:
                throughput[c].append(rate[c, "april"] / rate[c, "sync"])
            mean_step = {k: statistics.fmean(a["step_seconds"]) for k, a in got["arms"].items()}
            step_time.append(mean_step["april"] / mean_step["sync"])
            repeats.append({"complete": {k: a["complete"] for k, a in got["arms"].items()},
                            "discarded": {k: a["discarded"] for k, a in got["arms"].items()},
                            "step_seconds": mean_step, "lineage": got["lineage"],
                            "rollouts_per_s": {f"{k}_{c}": v for (c, k), v in rate.items()}})
            print(f"  april repeat {r}: throughput x{throughput['process'][-1]:.3f} "
                  f"(wall x{throughput['wall'][-1]:.3f}), step time x{step_time[-1]:.3f}",
                  file=sys.stderr)
    out = _figure("april_throughput_ratio", throughput["process"])
    out.update(_figure("april_throughput_ratio_wall", throughput["wall"]))
    out.update(_figure("april_step_time_ratio", step_time))
    return {**out, "april_repeats": repeats}


# --------------------------------------------------------------------------- smol-long arms


RESUME_KEYS = ("steps", "engine", "eval_size")  # what a kept run depends on


def earlier_runs(args: argparse.Namespace) -> dict[str, dict[int, dict[str, Any]]]:
    """The smol-long runs of ``--resume``'s file (an earlier ``--out``) by arm and seed;
    a file made with other ``RESUME_KEYS`` is refused."""
    if args.resume is None:
        return {}
    try:
        data = json.loads(args.resume.read_text())
        theirs, kept = data["settings"], data.get("long_runs", {})
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SystemExit(f"--resume {args.resume}: not an --out of bench/effects.py ({e!r})")
    differ = {k: (theirs.get(k), str(getattr(args, k))) for k in RESUME_KEYS
              if theirs.get(k) != str(getattr(args, k))}
    if differ:
        raise SystemExit(f"--resume {args.resume}: made with other settings (file, now): "
                         f"{differ}; its runs would not compare with new ones")
    return {arm: {r["seed"]: r for r in runs} for arm, runs in kept.items()}


CODE = ("gfcr", "stages", "store", "pipelines", "bench/*.py", "pyproject.toml")  # not results


def _commit() -> str | None:
    """This checkout's commit (``+dirty`` with changes to ``CODE``): a new run's provenance."""
    def git(*argv: str) -> str:
        return subprocess.run(["git", *argv], cwd=HERE.parent, capture_output=True,
                              text=True).stdout.strip()
    head = git("rev-parse", "--short", "HEAD")
    dirty = git("status", "--porcelain", "--untracked-files=no", "--", *CODE)
    return (head + ("+dirty" if dirty else "")) if head else None


def _long_run(args: argparse.Namespace, arm: str, seed: int) -> dict[str, Any]:
    """One bench/real_long.py child: ``arm`` on ``--engine`` under ``seed``."""
    steps = [] if args.steps is None else ["--steps", str(args.steps)]
    argv = ["--arm", arm, *steps, "--eval-size", str(args.eval_size), "--models",
            str(args.models), "--cache", str(args.cache), "--one", args.engine,
            "--seed", str(seed)]
    run = _runs.child(HERE.with_name("real_long.py"), argv, f"{arm} seed {seed}")
    print(f"  {arm} seed {seed}: {run['accuracy_start']:.3f} -> {run['accuracy_final']:.3f}, "
          f"{sum(run['tokens']):.0f} tokens ({run['run_seconds']:.0f} s)", file=sys.stderr)
    return run


def long_runs(args: argparse.Namespace, arms: list[str],
              done: Callable[[dict[str, list[dict[str, Any]]]], None],
              kept: dict[str, dict[int, dict[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
    """smol-long as it is and with each arm's operator, seeds outermost (a cut run still
    compares like with like), each a bench/real_long.py child on ``--engine``; ``kept``
    runs are not run again; ``done(runs)`` after each (``--out`` keeps a cut run's)."""
    runs: dict[str, list[dict[str, Any]]] = {a: [] for a in ["grpo", *arms]}
    commit = _commit()
    for seed in range(args.seeds):
        for arm in runs:
            if seed in kept.get(arm, {}):
                runs[arm].append(kept[arm][seed])
                print(f"  {arm} seed {seed}: kept from {args.resume}", file=sys.stderr)
            else:
                runs[arm].append({**_long_run(args, arm, seed), "commit": commit})
            done(runs)
    return runs


def warm_starts(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Every run's held-out accuracy after the warm start: one value where all started
    alike (a resumed run on another machine trains its warm start anew)."""
    starts = sorted({r["accuracy_start"] for rs in runs.values() for r in rs})
    out: dict[str, Any] = {"warm_start_accuracy": starts}
    if len(starts) > 1:
        out["warm_start_note"] = f"the runs started from {len(starts)} different warm starts"
    return out


def _second_half(run: dict[str, Any]) -> float:
    lengths = run["step_lengths"]
    return statistics.fmean(lengths[len(lengths) // 2:])


def _final(run: dict[str, Any]) -> dict[str, list[Any]]:
    """The greedy held-out completions of the run's last evaluation."""
    final: dict[str, list[Any]] = _runs.ordered_evals(run["evals"])[-1][1]
    return final


def _gain(run: dict[str, Any]) -> float:
    return 100.0 * (run["accuracy_final"] - run["accuracy_start"])


def overlong(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Length and accuracy with DAPO's soft overlong punishment against without."""
    pairs = list(zip(runs["overlong"], runs["grpo"]))
    out = _figure("overlong_length_ratio", [_second_half(a) / _second_half(b) for a, b in pairs])
    out.update(_figure("overlong_eval_length_ratio", [
        statistics.fmean(_final(a)["n_tokens"]) / statistics.fmean(_final(b)["n_tokens"])
        for a, b in pairs]))
    out.update(_accuracy("overlong", pairs))
    return out


def savings(runs: dict[str, list[dict[str, Any]]], arm: str) -> dict[str, Any]:
    """Tokens, accuracy and tokens per point of held-out gain, ``arm`` against plain."""
    pairs = list(zip(runs[arm], runs["grpo"]))
    out = _figure(f"{arm}_token_ratio", [sum(a["tokens"]) / sum(b["tokens"]) for a, b in pairs])
    out.update(_accuracy(arm, pairs))
    gains = [(_gain(a), _gain(b)) for a, b in pairs]
    if all(ga > 0 and gb > 0 for ga, gb in gains):
        out.update(_figure(f"{arm}_tokens_per_gain_ratio", [
            (sum(a["tokens"]) / ga) / (sum(b["tokens"]) / gb)
            for (a, b), (ga, gb) in zip(pairs, gains)]))
    else:
        out[f"{arm}_tokens_per_gain_ratio"] = out[f"{arm}_tokens_per_gain_ratio_se"] = None
        out[f"{arm}_note"] = ("tokens per point of gain undefined: gains (operator, plain) "
                              f"per seed {[(round(a, 2), round(b, 2)) for a, b in gains]} "
                              "are not all positive")
    return out


def _accuracy(arm: str, pairs: list[tuple[dict[str, Any], dict[str, Any]]]) -> dict[str, Any]:
    """``<arm>_accuracy_diff`` (points, over seeds), its per-prompt paired standard error
    and whether the two are within two of it (``<arm>_equal_accuracy``)."""
    out = _figure(f"{arm}_accuracy_diff",
                  [100.0 * (a["accuracy_final"] - b["accuracy_final"]) for a, b in pairs])
    diffs = [d for a, b in pairs for d in _runs.prompt_diffs(_final(a), _final(b))]
    paired = _runs.mean_se(diffs)[1]
    out[f"{arm}_accuracy_paired_se"] = paired
    out[f"{arm}_equal_accuracy"] = (None if paired is None else
                                    abs(statistics.fmean(diffs)) <= 2 * paired)
    return out


# --------------------------------------------------------------------------- GiGPO


def gigpo(args: argparse.Namespace) -> dict[str, Any]:
    """GiGPO against GRPO on smol-agent: held-out success gains over the warm start."""
    script = HERE.with_name("agentic_real.py")
    common = ["--split", "test", "--steps", str(args.agent_steps), "--eval-size",
              str(args.agent_eval_size), "--models", str(args.models), "--cache",
              str(args.cache)]
    warm = _runs.child(script, [*common, "--one", "warm"], "agent warm start")
    runs: dict[str, list[dict[str, Any]]] = {"grpo": [], "gigpo": []}
    for seed in range(args.seeds):
        for adv in runs:
            argv = [*common, "--advantage", adv, "--one", "hf", "--seed", str(seed)]
            runs[adv].append(_runs.child(script, argv, f"agent {adv} seed {seed}"))
            print(f"  agent {adv} seed {seed}: {warm['success']:.3f} -> "
                  f"{runs[adv][-1]['after']['success']:.3f}", file=sys.stderr)
    gains = {k: [100.0 * (r["after"]["success"] - warm["success"]) for r in v]
             for k, v in runs.items()}
    out: dict[str, Any] = {"agent_warm": warm, "agent_runs": runs}
    if all(g > 0 for g in gains["grpo"]):
        out.update(_figure("gigpo_gain_ratio", [a / b for a, b in zip(gains["gigpo"],
                                                                        gains["grpo"])]))
    else:
        out["gigpo_gain_ratio"] = out["gigpo_gain_ratio_se"] = None
        out["gigpo_note"] = f"GRPO gained nothing on some seed: {gains['grpo']}"
    out.update(_figure("gigpo_success_diff", [a - b for a, b in zip(gains["gigpo"],
                                                                     gains["grpo"])]))
    return out


# --------------------------------------------------------------------------- output


def _figure(key: str, values: list[float]) -> dict[str, Any]:
    mean, se = _runs.mean_se(values)
    return {key: mean, f"{key}_se": se, f"{key}_per_seed": values}


HEADLINES = {"april": ["april_throughput_ratio", "april_step_time_ratio"],
             "overlong": ["overlong_length_ratio", "overlong_eval_length_ratio",
                          "overlong_accuracy_diff"],
             "prune": ["prune_token_ratio", "prune_accuracy_diff", "prune_tokens_per_gain_ratio"],
             "tree": ["tree_token_ratio", "tree_accuracy_diff", "tree_tokens_per_gain_ratio"],
             "gigpo": ["gigpo_gain_ratio", "gigpo_success_diff"]}
"""The figures of each effect the table prints."""


def table(result: dict[str, Any]) -> str:
    head = f"{'figure':<30}{'value':>10}{'se':>8}  paper"
    lines = [head, "-" * len(head)]
    for effect in result["effects"]:
        for key in HEADLINES[effect]:
            value, se = result.get(key), result.get(f"{key}_se")
            lines.append(f"{key:<30}{_num(value):>10}{_num(se):>8}  "
                         + (PAPER[effect] if key == HEADLINES[effect][0] else ""))
        if result.get(f"{effect}_note"):
            lines.append(f"  note: {result[f'{effect}_note']}")
    if result.get("warm_start_note"):
        lines.append(f"note: {result['warm_start_note']}")
    return "\n".join(lines)


def _num(value: Any) -> str:
    return "-" if value is None else f"{value:.3f}"


def main() -> None:
    args = _args()
    only = [e for e in EFFECTS if e in args.only.split(",")]
    kept = earlier_runs(args)
    result: dict[str, Any] = {"effects": only, "paper": {e: PAPER[e] for e in only},
                              "settings": {k: str(v) for k, v in vars(args).items()
                                           if k not in ("json", "out", "resume")}}

    def save() -> None:
        if args.out:
            args.out.write_text(json.dumps(result))
    if "april" in only:
        result.update(april(args))
        save()
    arms = [a for a in ("overlong", "prune", "tree") if a in only]
    if arms:
        def keep(runs: dict[str, list[dict[str, Any]]]) -> None:
            result["long_runs"] = {k: [{x: y for x, y in r.items() if x != "lengths"}
                                       for r in v] for k, v in runs.items()}
            save()
        runs = long_runs(args, arms, keep, kept)
        result.update(warm_starts(runs))
        for arm in arms:
            result.update(overlong(runs) if arm == "overlong" else savings(runs, arm))
        save()
    if "gigpo" in only:
        result.update(gigpo(args))
        save()
    print(json.dumps(result) if args.json else table(result))


if __name__ == "__main__":
    main()
