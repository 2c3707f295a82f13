"""Engine benchmark: HFEngine's decode loop against plain ``model.generate``.

Both decode the same left-padded prompts with the same model and equivalent settings
(sampling at T=1, top_p=1, top_k off, no min length, same eos/pad ids, KV cache on, so
generate runs no logits processor at all); runs alternate and the medians are compared.
A generated token is one a sequence produced up to and including its EOS. HFEngine also computes every token's logprob; generate does
not, so the comparison slightly favours generate.

    .venv/bin/python bench/engine.py            # table
    .venv/bin/python bench/engine.py --json     # one JSON object
    .venv/bin/python bench/engine.py --threads 1 --clock process   # on a shared CPU box

``engine_vs_generate`` is tokens/s of HFEngine divided by tokens/s of generate for the
default TinyLlama; the target is at least 0.9. ``runtime_overhead`` is the share of a
default step spent in the runtime around the stages (Prefect tasks, staging, store
commit, MLflow, checkpoints; see ``bench/_overhead.py``), measured in one run, on the
clock ``--clock`` names: ``wall``, the step's time, or ``process``, this process's CPU
(all threads: the runtime's background threads count in full). The JSON holds both,
where the runtime's CPU goes by thread, and how much the runtime slows the stages
(``work_inflation``). The target is at most 5%.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import random
import statistics
import string
import time
from pathlib import Path
from typing import Any

import torch

_HERE = Path(__file__).resolve().parent
# run as a script, bench/ comes first on sys.path and bench/store.py would shadow the
# `store` package: take bench/ off and load the sibling helper by path
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
_spec = importlib.util.spec_from_file_location("_overhead", _HERE / "_overhead.py")
_overhead = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_overhead)
runtime_overhead = _overhead.runtime_overhead
_vspec = importlib.util.spec_from_file_location("_vllm_bench", _HERE / "_vllm.py")
_vllm = importlib.util.module_from_spec(_vspec)

from gfcr.core.engine import GenRequest, SamplingParams
from gfcr.core.loading import load
from stages.engines.hf import HF
from stages.engines.tiny import TinyLlama

MODELS: dict[str, TinyLlama] = {
    "tiny_llama (default)": TinyLlama(),
    "tiny_llama h512 l8": TinyLlama(hidden_size=512, num_layers=8, num_heads=8,
                                    intermediate_size=1024),
}


def _prompts(n: int, chars: int, seed: int) -> list[str]:
    """``n`` printable prompts of ``chars`` ± 10 % characters (lengths differ: padding)."""
    rng = random.Random(seed)
    alphabet = string.ascii_letters + string.digits + " +-*=?.,"
    spread = max(1, chars // 10)
    return ["".join(rng.choice(alphabet) for _ in range(chars + rng.randint(-spread, spread)))
            for _ in range(n)]


def _left_pad(rows: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r):] = torch.tensor(r)
        mask[i, width - len(r):] = 1
    return ids, mask


def _generated(new: torch.Tensor, eos: int) -> int:
    """Tokens produced per row of generate's output, up to and including the first EOS."""
    total = 0
    for row in new.tolist():
        total += row.index(eos) + 1 if eos in row else len(row)
    return total


CLOCKS = {"wall": time.perf_counter, "process": time.process_time}
"""``process`` counts this process's CPU time only: steadier on a shared CPU machine (with
one thread it equals wall time minus time other processes took); meaningless on GPU."""


def _time_generate(model: Any, ids: torch.Tensor, mask: torch.Tensor, settings: dict,
                   seed: int, clock: str) -> tuple[float, int]:
    torch.manual_seed(seed)
    t = CLOCKS[clock]()
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=mask, **settings)
    seconds = CLOCKS[clock]() - t
    return seconds, _generated(out[:, ids.shape[1]:], settings["eos_token_id"])


def _time_engine(engine: Any, requests: list[GenRequest], params: SamplingParams,
                 clock: str) -> tuple[float, int]:
    t = CLOCKS[clock]()
    outs = engine.generate(requests, params)
    seconds = CLOCKS[clock]() - t
    return seconds, sum(len(o.completion_ids) for o in outs)


def engine_vs_generate(policy_spec: TinyLlama, *, prompts: int = 64, chars: int = 70,
                       new_tokens: int = 16, temperature: float = 1.0, top_p: float = 1.0,
                       repeats: int = 5, seed: int = 0, clock: str = "wall") -> dict:
    """Median tokens/s of HFEngine and of ``model.generate`` on the same prompts, runs
    alternating (after one warm-up each); returns both, their ratio and the settings."""
    policy = policy_spec.build(seed=seed)
    engine = HF(device="cpu", max_batch=max(1, prompts)).build(policy, seed=seed)
    model, tok = policy.model, policy.tokenizer
    model.eval()
    rows = [tok.encode(p) for p in _prompts(prompts, chars, seed)]
    requests = [GenRequest(key=i, prompt_ids=r) for i, r in enumerate(rows)]
    params = SamplingParams(temperature=temperature, top_p=top_p, max_tokens=new_tokens,
                            segment_tokens=new_tokens, seed=seed)
    ids, mask = _left_pad(rows, tok.pad_token_id)
    # min length stays at its default 0: passing min_new_tokens=0 would add a (no-op)
    # MinLengthLogitsProcessor. T=1, top_p=1, top_k=None add no processor either.
    settings = dict(do_sample=temperature > 0, temperature=temperature or None,
                    top_p=top_p, top_k=None, max_new_tokens=new_tokens,
                    eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                    use_cache=True, num_beams=1, repetition_penalty=None)
    _time_engine(engine, requests, params, clock)
    _time_generate(model, ids, mask, settings, seed, clock)
    eng_rates, gen_rates = [], []
    for r in range(repeats):  # alternate which goes first: drift hits both alike
        runs = [("engine", lambda: _time_engine(engine, requests, params, clock)),
                ("generate", lambda: _time_generate(model, ids, mask, settings, seed + r,
                                                    clock))]
        for name, fn in runs if r % 2 == 0 else runs[::-1]:
            s, n = fn()
            (eng_rates if name == "engine" else gen_rates).append(n / s)
    eng, gen = statistics.median(eng_rates), statistics.median(gen_rates)
    return {"engine_tok_s": eng, "generate_tok_s": gen, "ratio": eng / gen,
            "params": sum(p.numel() for p in model.parameters()),
            "settings": {"prompts": prompts, "prompt_chars": chars, "new_tokens": new_tokens,
                         "temperature": temperature, "top_p": top_p, "top_k": "off",
                         "min_new_tokens": 0, "repeats": repeats, "device": "cpu",
                         "threads": torch.get_num_threads(), "clock": clock}}


def _print_table(rows: dict[str, dict]) -> None:
    headers = ["model", "params", "HFEngine tok/s", "generate tok/s", "ratio"]
    lines = [[name, f"{r['params'] / 1e6:.2f}M", f"{r['engine_tok_s']:.0f}",
              f"{r['generate_tok_s']:.0f}", f"{r['ratio']:.2f}x"] for name, r in rows.items()]
    settings = next(iter(rows.values()))["settings"]
    caption = ("settings: " + ", ".join(f"{k}={v}" for k, v in settings.items())
               + "; generate: do_sample, same T/top_p, top_k=None, eos/pad ids set")
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        print("\t".join(headers))
        for line in lines:
            print("\t".join(line))
        print(caption)
        return
    table = Table(title="HFEngine vs model.generate (median tokens/s)", caption=caption)
    for h in headers:
        table.add_column(h, justify="left" if h == "model" else "right")
    for line in lines:
        table.add_row(*line)
    Console().print(table)


def _print_overhead(o: dict[str, Any], steps: int) -> None:
    print(f"runtime overhead of a default step (Prefect tasks, staging, store commit, MLflow, "
          f"checkpoints), over {steps} steps:")
    for clock in ("process", "wall"):
        c = o[clock]
        print(f"  {clock:7s}: {c['runtime_overhead']:.1%}  (median step {c['step_s']:.3f} s, "
              f"its stages {c['stages_s']:.3f} s; median per-step share "
              f"{c['median_step_overhead']:.1%})")
    print(f"  the stages' CPU against a bare run (no Prefect, store, MLflow): "
          f"{o['work_inflation']:+.1%}")
    if o["threads"]:
        print("  the runtime's CPU a step, by thread:")
        for name, seconds in o["threads"].items():
            print(f"    {name:34s} {seconds * 1000:7.1f} ms")
    if o["server_cpu_step_s"] is not None:
        print(f"  Prefect server CPU a step (another process, in neither figure): "
              f"{o['server_cpu_step_s']:.3f} s")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--default-only", action="store_true",
                        help="skip the larger model row")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads (default: torch's choice); 1 is steadier "
                             "on a shared machine")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                        help="wall time, or this process's CPU time (see CLOCKS), for "
                             "engine_vs_generate and runtime_overhead")
    parser.add_argument("--overhead-steps", type=int, default=12,
                        help="steps of the default pipeline for the runtime overhead")
    parser.add_argument("--vllm", action="store_true",
                        help="also vllm_vs_raw, vllm_vs_hf and a default step on each "
                             "engine (bench/_vllm.py; needs vLLM)")
    parser.add_argument("--vllm-steps", type=int, default=6,
                        help="default-pipeline steps per engine for the step time")
    parser.add_argument("--skip-overhead", action="store_true",
                        help="skip the runtime-overhead measurement")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    names = list(MODELS)[:1] if args.default_only else list(MODELS)
    rows = {name: engine_vs_generate(MODELS[name], prompts=args.prompts,
                                     new_tokens=args.new_tokens, repeats=args.repeats,
                                     clock=args.clock)
            for name in names}
    default = rows[names[0]]
    overhead = None if args.skip_overhead else runtime_overhead(
        load("default"), steps=args.overhead_steps, clock=args.clock)
    vllm = _vllm_figures(args)
    if args.json:
        print(json.dumps({"engine_vs_generate": round(default["ratio"], 3),
                          "runtime_overhead": overhead and round(overhead["runtime_overhead"], 4),
                          **({"vllm_vs_raw": vllm["vllm_vs_raw"], "vllm_vs_hf": vllm["vllm_vs_hf"],
                              "vllm": vllm} if vllm else {}),
                          "rows": rows, "overhead": overhead}, default=str))
        return
    _print_table(rows)
    if overhead:
        _print_overhead(overhead, args.overhead_steps - 2)
    if vllm:
        _vllm.print_figures(vllm)


def _vllm_figures(args: argparse.Namespace) -> dict[str, Any] | None:
    if not args.vllm:
        return None
    import tempfile
    _vspec.loader.exec_module(_vllm)
    with tempfile.TemporaryDirectory(prefix="gfcr-bench-vllm-") as root:
        return _vllm.figures(_prompts(args.prompts, 70, 0), new_tokens=args.new_tokens,
                             repeats=args.repeats, steps=args.vllm_steps, root=Path(root),
                             clock=args.clock)


if __name__ == "__main__":
    main()
