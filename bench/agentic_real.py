"""SmolLM2 learning to use a Python tool: held-out episode success and tool-call rate
before and after GRPO, on the HF engine and on vLLM (its CPU build here).

The ``smol-agent`` pipeline (pipelines/smol_agent.py: ``chain_sum`` of 3-4 digit numbers,
the ``python_tool`` environment, two policy turns) or, with ``--pipeline openai``, its
AgentEnv variant (pipelines/smol_agent_openai.py: an ``openai``-client agent calling
the tool through gfcr's endpoint), from one cached demonstration warm start (seed 0),
trained ``--steps`` GRPO steps per seed and engine. Every run is a subprocess (its own
memory and vLLM process). Held-out episodes are greedy, on the HF engine, with the
``python_tool`` environment for both pipelines (their conversations render to the same
ids), so the engines and pipelines differ only in what they trained on. They are
sampled at temperature 1 by default (one episode per prompt, one sampling seed for
every model): greedy episodes are saturated after the warm start (32 of 32 and 31 of 32
validation prompts right, BENCHMARKS.md), while the sampled policy, the one GRPO trains,
still answers in its head part of the time.

Honest method: the task's 512 held-out prompts are split in two; ``--split val`` (the
first 256) is where steps and learning rates are chosen, ``--split test`` (the other
256, the default) is where the figures are reported, and is never used to choose.

Figures (JSON keys): ``tool_call_rate`` (share of held-out episodes with a tool call
after training, mean over runs of both engines), ``tool_call_rate_warm`` and
``success_warm`` (after the warm start), ``heldout_gain_hf`` / ``heldout_gain_vllm``
(success after minus after the warm start, in points, mean over seeds) and
``gain_se_hf`` / ``gain_se_vllm`` (standard error over seeds, ``sd / sqrt(seeds)``);
per run, its per-step ``tool/*`` training metrics (gfcr.runner.tool_metrics).

    nice -n 10 .venv/bin/python bench/agentic_real.py --json --out /tmp/agentic_real.json
    .venv/bin/python bench/agentic_real.py --smoke           # 1 seed, 1 step, 4 prompts
    .venv/bin/python bench/agentic_real.py --split val --lr 3e-5 --steps 10  # choosing
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

sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

_spec = importlib.util.spec_from_file_location("_runs", Path(__file__).with_name("_runs.py"))
_runs = sys.modules["_runs"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_runs)  # bench/_runs.py by path: this folder is off sys.path

HERE = Path(__file__).resolve()
PIPELINES = {"episodes": "pipelines.smol_agent", "openai": "pipelines.smol_agent_openai"}
"""``--pipeline`` -> the module whose ``pipeline`` is run."""
GENERATE = {"episodes": "episodes", "openai": "agent"}
"""``--pipeline`` -> the generate stage's override prefix."""
SMOKE = {"seeds": 1, "steps": 1, "batch": 2, "n": 2, "eval_size": 4, "warm_steps": 2,
         "warm_batch": 2}
"""What ``--smoke`` sets: a wiring check in minutes, not a measurement."""
HALF = 256
"""Held-out prompts per split (the task holds 2 x HALF)."""


def _args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--out", type=Path, help="also write the JSON object here (after each run)")
    ap.add_argument("--pipeline", choices=sorted(PIPELINES), default="episodes")
    ap.add_argument("--engines", default="hf,vllm")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=None, help="GRPO steps (the pipeline's)")
    ap.add_argument("--lr", type=float, default=None, help="GRPO lr (the pipeline's)")
    ap.add_argument("--batch", type=int, default=4, help="prompts per step (the pipeline's)")
    ap.add_argument("--n", type=int, default=4, help="episodes per prompt")
    ap.add_argument("--split", choices=["val", "test"], default="test")
    ap.add_argument("--eval-size", type=int, default=HALF, help=f"held-out prompts (<= {HALF})")
    ap.add_argument("--eval-temperature", type=float, default=1.0,
                    help="held-out episodes' temperature (0: greedy; saturated, see above)")
    ap.add_argument("--warm-steps", type=int, default=None, help="SFT steps (the pipeline's)")
    ap.add_argument("--warm-batch", type=int, default=None, help="SFT batch (the pipeline's)")
    ap.add_argument("--warm-lr", type=float, default=None, help="SFT lr (the pipeline's)")
    ap.add_argument("--demos", default=None,
                    help="the warm start's demonstrations, module:function (the pipeline's)")
    ap.add_argument("--advantage", choices=["grpo", "gigpo"], default="grpo",
                    help="GRPO's episode advantages, or GiGPO's step-level ones before it "
                         "(bench/effects.py)")
    ap.add_argument("--smoke", action="store_true", help=f"a wiring check: {SMOKE}")
    ap.add_argument("--models", type=Path, default=Path(".gfcr"),
                    help="run root whose cache holds the converted model")
    ap.add_argument("--cache", type=Path, default=Path(".gfcr/cache"), help="warm-start cache")
    ap.add_argument("--one", choices=["warm", "hf", "vllm"], help=argparse.SUPPRESS)
    ap.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.smoke:
        for key, value in SMOKE.items():
            setattr(args, key, value)
    args.eval_size = min(args.eval_size, HALF)
    return args


# --------------------------------------------------------------------------- one run


def pipeline(args: argparse.Namespace, engine: str, seed: int) -> Any:
    """The chosen pipeline at the benchmark's size, from the shared warm start (seed 0),
    checkpointed at its last step."""
    import importlib

    from gfcr import Pipeline

    base = importlib.import_module(PIPELINES[args.pipeline]).pipeline
    steps = args.steps if args.steps is not None else base.steps
    lr = args.lr if args.lr is not None else base.stages[-1].lr
    gen = GENERATE[args.pipeline]
    sets = [f"steps={steps}", f"seed={seed}", "evaluation.every=0", "evaluation.size=4",
            f"checkpoint.every={steps}", f"uniform.batch={args.batch}", f"{gen}.n={args.n}",
            f"grpo.lr={lr}", f"grpo.micro_batch={min(8, args.batch * args.n)}",
            f"policy.root={args.models}"]
    if engine == "vllm":
        sets += ["engine=vllm", "engine.max_model_len=512"]
    data = base.with_overrides(sets).to_dict()
    if args.advantage == "gigpo":  # Feng et al. 2025: step groups of the same anchor state
        from stages import GiGPO

        data["stages"] = [*data["stages"][:-1], GiGPO().model_dump(), data["stages"][-1]]
    sft = base.warmstart.model_copy(update={k: v for k, v in {
        "steps": args.warm_steps, "batch_size": args.warm_batch, "lr": args.warm_lr,
        "demonstrations": args.demos}.items()
        if v is not None})
    data["warmstart"] = _runs.SharedWarmStart(sft=sft, cache=str(args.cache))
    return Pipeline(**{**data, "name": f"bench-agentic-real-{args.advantage}-{engine}"})


def heldout(p: Any, weights: Path | None, args: argparse.Namespace) -> dict[str, float]:
    """Held-out episodes (python_tool, HF engine, one per prompt at
    ``--eval-temperature``, the same sampling seed for every model) with ``weights``
    (None: the warm start) on the ``--split`` half: success, tool-call rate, tool-error
    rate."""
    from gfcr.core.stage import StepContext
    from gfcr.runner.tool_metrics import tool_metrics
    from pipelines.smol_agent import EPISODES
    from stages import HF, Episodes

    policy = p.policy.build(seed=0)
    if weights is None:
        p.warmstart.run(policy, p.task, seed=0, cache_dir=Path("unused"))
    else:
        policy.load_weights(weights)
    engine = HF(device="cpu").build(policy, seed=0)
    stage = Episodes(env="python_tool", **{**EPISODES, "n": 1,
                                           "temperature": args.eval_temperature})
    start = 0 if args.split == "val" else HALF
    prompts = p.task.heldout_prompts().slice(start, args.eval_size)
    ctx = StepContext(run_id="heldout", step=0, seed=0, policy_version=0, task=p.task)
    rows = stage.generate(ctx, prompts, engine, None)
    figures = tool_metrics(rows)
    return {"success": figures["tool/success"], "tool_call_rate": figures["tool/call_rate"],
            "tool_error_rate": figures["tool/error_rate"], "prompts": float(rows.num_rows)}


def run_one(args: argparse.Namespace, engine: str) -> dict[str, Any]:
    """One seed on ``engine``: train, then the held-out episodes with its last weights."""
    p = pipeline(args, engine, args.seed)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gfcr-agentic-real-") as tmp:
        summary, weights = _runs.last_weights(p, Path(tmp))
        after = heldout(p, weights, args)
    hist = summary.history
    return {"engine": engine, "seed": args.seed, "after": after,
            "tool_steps": [{k: m[k] for k in m if k.startswith("tool/")} for m in hist],
            "approx_kl": [m.get("train/approx_kl") for m in hist],
            "run_seconds": time.perf_counter() - started}


# --------------------------------------------------------------------------- all runs


def summarise(warm: dict[str, Any], runs: list[dict[str, Any]],
              args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"settings": {k: str(v) for k, v in vars(args).items()
                                        if k not in ("json", "out", "one", "seed")},
                           "warm_start": warm, "runs": runs,
                           "success_warm": warm["success"],
                           "tool_call_rate_warm": warm["tool_call_rate"]}
    rates = [r["after"]["tool_call_rate"] for r in runs]
    out["tool_call_rate"] = statistics.fmean(rates) if rates else None
    for e in ("hf", "vllm"):
        gains = [100.0 * (r["after"]["success"] - warm["success"]) for r in runs
                 if r["engine"] == e]
        out[f"heldout_gain_{e}"], out[f"gain_se_{e}"] = _runs.mean_se(gains)
    return out


def table(result: dict[str, Any]) -> str:
    head = f"{'run':<12}{'success':>9}{'tool calls':>12}{'tool errors':>13}{'seconds':>9}"
    warm = result["warm_start"]
    lines = [head, "-" * len(head), f"{'warm start':<12}{warm['success']:>9.3f}"
             f"{warm['tool_call_rate']:>12.3f}{warm['tool_error_rate']:>13.3f}"]
    for r in result["runs"]:
        a = r["after"]
        lines.append(f"{r['engine'] + ' ' + str(r['seed']):<12}{a['success']:>9.3f}"
                     f"{a['tool_call_rate']:>12.3f}{a['tool_error_rate']:>13.3f}"
                     f"{r['run_seconds']:>9.0f}")
    gains = "; ".join(f"heldout_gain_{e}: {result[f'heldout_gain_{e}']:+.1f} +- "
                      f"{result[f'gain_se_{e}'] or float('nan'):.1f} points"
                      for e in ("hf", "vllm") if result[f"heldout_gain_{e}"] is not None)
    return "\n".join(lines) + f"\n{gains} ({result['settings']['split']} split)"


def main() -> None:
    args = _args()
    if args.one == "warm":
        print(json.dumps(heldout(pipeline(args, "hf", 0), None, args)))
        return
    if args.one in ("hf", "vllm"):
        print(json.dumps(run_one(args, args.one)))
        return
    warm = _runs.rerun(HERE, "warm", 0)
    print(f"  warm start: {json.dumps(warm)}", file=sys.stderr)
    runs: list[dict[str, Any]] = []
    for seed in range(args.seeds):
        for engine in (e for e in args.engines.split(",") if e):
            runs.append(_runs.rerun(HERE, engine, seed))
            print(f"  {engine} seed {seed}: {json.dumps(runs[-1]['after'])} "
                  f"({runs[-1]['run_seconds']:.0f}s)", file=sys.stderr)
            if args.out:
                args.out.write_text(json.dumps(summarise(warm, runs, args)))
    result = summarise(warm, runs, args)
    if args.out:
        args.out.write_text(json.dumps(result))
    print(json.dumps(result) if args.json else table(result))


if __name__ == "__main__":
    main()
