"""vLLM figures for bench/engine.py (``--vllm``): gfcr's vLLM engine against raw
``LLM.generate``, the vLLM engine against the HF engine, and a default step on each.

- ``vllm_vs_raw``: tokens/s of ``VLLMEngine.generate`` (no segment hook: one
  ``LLM.generate`` per call, plus the request/response conversion and the RNG swap)
  over tokens/s of ``LLM.generate`` called directly on the same ``LLM`` with the same
  prompts and settings (T=1, top_p=1, the policy's EOS as stop token, processed
  logprobs of the sampled token). Target: at least 0.95.
- ``vllm_vs_hf``: tokens/s of the vLLM engine over the HF engine on the same prompts
  and settings (no hook), for the default TinyLlama and a ~20M-parameter one.
- ``step_seconds``: the median time of a default-pipeline step (warm start skipped,
  steps 1.. of a short run, in-process) on each engine.

Runs alternate (after one warm-up each) and medians are compared, so machine load hits
both sides alike; the figures are ratios taken in one run. On a crowded machine use
``--clock process`` (this process's CPU time; vLLM runs in it): at load 30 on 2 cores the
wall-clock rates of identical calls swung by 1.7x from one call to the next.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any, Callable

from gfcr.core.engine import GenRequest, SamplingParams
from stages.engines.hf import HF
from stages.engines.tiny import TinyLlama
from stages.engines.vllm import VLLM

VLLM_MODELS: dict[str, TinyLlama] = {
    "tiny_llama (default)": TinyLlama(),
    "tiny_llama ~20M": TinyLlama(hidden_size=512, num_layers=6, num_heads=8,
                                 intermediate_size=1536),
}


def _alternate(fns: dict[str, Callable[[], tuple[float, int]]], repeats: int
               ) -> dict[str, float]:
    """Median tokens/s of each function, one warm-up each, order alternating."""
    for fn in fns.values():
        fn()
    rates: dict[str, list[float]] = {name: [] for name in fns}
    items = list(fns.items())
    for r in range(repeats):
        for name, fn in items if r % 2 == 0 else items[::-1]:
            seconds, tokens = fn()
            rates[name].append(tokens / seconds)
    return {name: statistics.median(v) for name, v in rates.items()}


CLOCK: dict[str, Callable[[], float]] = {"wall": time.perf_counter,
                                         "process": time.process_time}
_clock = CLOCK["wall"]


def _timed(fn: Callable[[], int]) -> tuple[float, int]:
    """Seconds on the chosen clock (``process``: this process's CPU, every thread; vLLM
    runs in-process, so it is all counted) and the tokens ``fn`` generated."""
    t = _clock()
    tokens = fn()
    return _clock() - t, tokens


def _requests(engine: Any, prompts: list[str]) -> list[GenRequest]:
    return [GenRequest(key=i, prompt_ids=engine.encode(p)) for i, p in enumerate(prompts)]


def vllm_vs_raw(prompts: list[str], *, new_tokens: int, repeats: int) -> dict[str, Any]:
    """The engine's overhead over the ``LLM`` it drives, default TinyLlama."""
    from vllm import SamplingParams as VSampling
    from vllm import TokensPrompt

    engine = VLLM().build(TinyLlama().build(seed=0), seed=0)
    requests = _requests(engine, prompts)
    params = SamplingParams(temperature=1.0, max_tokens=new_tokens, seed=0)
    eos = engine.policy.tokenizer.eos_token_id
    raw_prompts = [TokensPrompt(prompt_token_ids=r.prompt_ids) for r in requests]
    raw_params = VSampling(temperature=1.0, top_p=1.0, max_tokens=new_tokens, logprobs=0,
                           detokenize=False, stop_token_ids=[eos])

    def ours() -> int:
        return sum(len(o.completion_ids) for o in engine.generate(requests, params))

    def raw() -> int:
        outs = engine.llm.generate(raw_prompts, raw_params, use_tqdm=False)
        return sum(len(o.outputs[0].token_ids) for o in outs)

    rates = _alternate({"engine": lambda: _timed(ours), "raw": lambda: _timed(raw)}, repeats)
    return {"engine_tok_s": rates["engine"], "raw_tok_s": rates["raw"],
            "ratio": rates["engine"] / rates["raw"]}


def vllm_vs_hf(spec: TinyLlama, prompts: list[str], *, new_tokens: int, repeats: int
               ) -> dict[str, Any]:
    """The vLLM engine against the HF engine on one policy shape (separate copies)."""
    hf = HF(device="auto", max_batch=max(1, len(prompts))).build(spec.build(seed=0), seed=0)
    vllm = VLLM().build(spec.build(seed=0), seed=0)
    params = SamplingParams(temperature=1.0, max_tokens=new_tokens, seed=0)
    engines = {"hf": hf, "vllm": vllm}
    fns = {name: (lambda e=e: _timed(lambda: sum(
        len(o.completion_ids) for o in e.generate(_requests(e, prompts), params))))
        for name, e in engines.items()}
    rates = _alternate(fns, repeats)
    return {"hf_tok_s": rates["hf"], "vllm_tok_s": rates["vllm"],
            "ratio": rates["vllm"] / rates["hf"],
            "params": sum(p.numel() for p in hf.policy.model.parameters())}


def step_seconds(steps: int, root: Path) -> dict[str, float]:
    """Median step time of the default pipeline (no warm start) on each engine."""
    from gfcr.core.loading import load
    from gfcr.launch.run import execute

    out: dict[str, float] = {}
    for engine in ("hf", "vllm"):
        p = load("default").with_overrides([f"engine={engine}", f"steps={steps}"])
        p = p.model_copy(update={"warmstart": None})
        summary = execute(p, root=root / engine, executor="local")
        out[engine] = statistics.median(m["step_seconds"] for m in summary.history[1:])
    out["vllm_over_hf"] = out["vllm"] / out["hf"]
    return out


def figures(prompts: list[str], *, new_tokens: int, repeats: int, steps: int,
            root: Path, clock: str = "wall") -> dict[str, Any]:
    """Everything above, for ``bench/engine.py --vllm`` (tokens/s on ``clock``)."""
    global _clock
    _clock = CLOCK[clock]
    raw = vllm_vs_raw(prompts, new_tokens=new_tokens, repeats=repeats)
    rows = {name: vllm_vs_hf(spec, prompts, new_tokens=new_tokens, repeats=repeats)
            for name, spec in VLLM_MODELS.items()}
    default = rows[next(iter(rows))]
    return {"vllm_vs_raw": round(raw["ratio"], 3), "vllm_vs_hf": round(default["ratio"], 3),
            "clock": clock, "raw": raw, "vs_hf": rows, "step_seconds": step_seconds(steps, root)}


def print_figures(f: dict[str, Any]) -> None:
    raw = f["raw"]
    print(f"vllm_vs_raw: {f['vllm_vs_raw']:.3f}  (engine {raw['engine_tok_s']:.0f} tok/s, "
          f"raw LLM.generate {raw['raw_tok_s']:.0f} tok/s)")
    for name, r in f["vs_hf"].items():
        print(f"vllm_vs_hf [{name}, {r['params'] / 1e6:.1f}M]: {r['ratio']:.2f}  "
              f"(vLLM {r['vllm_tok_s']:.0f} tok/s, HF {r['hf_tok_s']:.0f} tok/s)")
    s = f["step_seconds"]
    print(f"default step: HF {s['hf']:.2f} s, vLLM {s['vllm']:.2f} s "
          f"(vLLM/HF {s['vllm_over_hf']:.2f})")
