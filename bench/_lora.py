"""LoRA against full training: one GRPO step's peak memory, and the weight sync of an
adapter version against the whole weights (issue 25; bench/learner.py imports
:func:`figures`).

    .venv/bin/python bench/_lora.py            # table, SmolLM2-size model
    .venv/bin/python bench/_lora.py --quick    # a small config (seconds)
    .venv/bin/python bench/_lora.py --json     # one JSON object

The model is config-built (no download): SmolLM2-135M's shape, a Llama of 30 layers,
hidden 576, 9 heads, 3 KV heads, intermediate 1536, vocabulary 49152, tied embeddings
(``--quick``: 4 layers, hidden 128, vocabulary 4096). LoRA: r=16, alpha=32 on every
linear layer of a block (``LoraSpec``'s default targets).

- ``full_peak_mb`` / ``lora_peak_mb``: the learner's own ``peak_memory_mb`` of one
  ``GRPOLearner.update`` (stages.train.memory: on CPU the process's peak resident set
  since the step began, weights included; on CUDA ``max_memory_allocated``) on a short
  batch (8 rows of 32 prompt + 32 completion tokens, behaviour logprobs from the model
  itself so every ratio starts at 1), each in a fresh subprocess so neither sees the
  other's allocations, and the set-up's freed memory handed back to the OS first
  (``malloc_trim``). ``lora_memory_ratio`` is LoRA over full;
  ``lora_memory_ratio_checkpointed`` the same with ``gradient_checkpointing`` on both
  (activations recomputed: what remains is mostly weights, gradients, optimizer state).
- ``full_step_s`` / ``lora_step_s``: that update's wall time (one step, loaded machine).
- sync, in this process, median of 3: ``*_copy_s`` hands a version to an HF engine
  holding its own copy of the policy (an asynchronous run's): the whole state dict loaded
  in place, against the adapter's tensors copied into its adapter layers;
  ``*_write_s`` publishes a version for a fleet (gfcr.weights.versions.FileSync): one
  ``model.safetensors`` of every weight, against the adapter folder in peft's format.
  ``adapter_sync_vs_full`` is the write's ratio (adapter over full),
  ``adapter_copy_vs_full`` the copy's; ``adapter_mb`` / ``full_mb`` the bytes moved.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(ROOT))

SMOL = dict(num_hidden_layers=30, hidden_size=576, num_attention_heads=9,
            num_key_value_heads=3, intermediate_size=1536, vocab_size=49152)
QUICK = dict(num_hidden_layers=4, hidden_size=128, num_attention_heads=4,
             num_key_value_heads=2, intermediate_size=256, vocab_size=4096)
ROWS, PROMPT, COMPLETION = 8, 32, 32
R, ALPHA = 16, 32.0


def _policy(shape: dict[str, int], seed: int) -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from gfcr.core.policy import Policy
    from stages.engines.tokenizers import ByteTokenizer
    from stages.engines.torch_io import TORCH_IO

    config = LlamaConfig(**shape, max_position_embeddings=256, tie_word_embeddings=True)
    torch.manual_seed(seed)
    return Policy(model=LlamaForCausalLM(config), tokenizer=ByteTokenizer(), io=TORCH_IO)


def _batch(policy: Any, vocab: int) -> Any:
    """``ROWS`` rows in groups of 4 with rewards 0/1 (every advantage non-zero), random
    token ids, behaviour logprobs from the model itself."""
    import numpy as np
    import pyarrow as pa
    import torch

    from stages.engines.hf_sampling import batch_token_logprobs

    rng = np.random.default_rng(0)
    prompts = rng.integers(3, vocab, (ROWS, PROMPT)).tolist()
    comps = rng.integers(3, vocab, (ROWS, COMPLETION)).tolist()
    with torch.no_grad():
        lp, _ = batch_token_logprobs(policy.model, prompts, comps)
    return pa.table({"reward": [float(i % 2) for i in range(ROWS)],
                     "group_id": [f"g{i // 4}" for i in range(ROWS)],
                     "prompt_ids": prompts, "completion_ids": comps,
                     "logprobs": pa.array(lp.tolist(), pa.list_(pa.float32()))})


def _lora() -> Any:
    from stages.train.lora import LoraSpec

    return LoraSpec(r=R, alpha=ALPHA)


def one_step(shape: dict[str, int], lora: bool, checkpointing: bool) -> dict[str, float]:
    """One GRPO update's peak memory and seconds (run in a fresh process)."""
    import torch

    from stages import GRPO

    torch.set_num_threads(1)
    policy = _policy(shape, 0)
    batch = _batch(policy, shape["vocab_size"])
    learner = GRPO(lr=1e-4, lora=_lora() if lora else None,
                   gradient_checkpointing=checkpointing).learner(policy, seed=0)
    learner.start_adapter()  # the first update would inject it: setup, not the step
    _trim()
    started = time.perf_counter()
    result = learner.update(None, batch)
    return {"peak_mb": result.metrics["peak_memory_mb"],
            "step_s": time.perf_counter() - started,
            "scope": result.metrics["peak_memory_scope"]}


def _trim() -> None:
    """Give the memory the set-up freed back to the OS (glibc's ``malloc_trim``), so the
    step's peak resident set is not the set-up's leftovers."""
    import ctypes

    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass


def _in_child(quick: bool, lora: bool, checkpointing: bool = False) -> dict[str, float]:
    args = [sys.executable, __file__, "--step", "lora" if lora else "full"]
    args += (["--quick"] if quick else []) + (["--checkpointing"] if checkpointing else [])
    out = subprocess.run(args, capture_output=True,
                         text=True, check=True, cwd=ROOT)
    found: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return found


def _median_s(fn: Callable[[], Any], times: int = 3) -> float:
    spent = []
    for _ in range(times):
        started = time.perf_counter()
        fn()
        spent.append(time.perf_counter() - started)
    return statistics.median(spent)


def sync(shape: dict[str, int]) -> dict[str, float]:
    """Handing a version to an engine with its own copy, and writing it for FileSync:
    the whole weights, then the adapter (same models, same process)."""
    import torch

    from gfcr.runner.inprocess import InProcessHandle
    from gfcr.weights.versions import FileSync, WeightStore
    from stages import GRPO, HF
    from stages.engines.torch_io import TORCH_IO

    torch.set_num_threads(1)
    policy, own = _policy(shape, 0), _policy(shape, 1)
    engine = HF(device="cpu").build(own, seed=0)
    full = InProcessHandle(policy, 1)
    full_bytes = sum(t.numel() * t.element_size() for t in full.state().values())
    with tempfile.TemporaryDirectory() as tmp:
        store = WeightStore(Path(tmp) / "full", TORCH_IO, keep=1)
        full_copy = _median_s(lambda: engine.update_weights(full.state()))
        full_write = _median_s(lambda: FileSync(store, "bench").send(full))
        learner = GRPO(lr=1e-4, lora=_lora()).learner(policy, seed=0)
        learner.start_adapter()
        adapter = learner.adapter_handle(2)
        engine.update_weights(adapter.state())  # injects the adapter into the engine's copy
        store = WeightStore(Path(tmp) / "adapter", TORCH_IO, keep=1)
        adapter_copy = _median_s(lambda: engine.update_weights(adapter.state()))
        adapter_write = _median_s(lambda: FileSync(store, "bench").send(adapter))
    return {"full_copy_s": full_copy, "adapter_copy_s": adapter_copy,
            "full_write_s": full_write, "adapter_write_s": adapter_write,
            "full_mb": full_bytes / 2**20, "adapter_mb": adapter.state().nbytes() / 2**20}


def figures(quick: bool) -> dict[str, float]:
    """The figures above (``quick``: the small config)."""
    shape = QUICK if quick else SMOL
    full, lora = _in_child(quick, lora=False), _in_child(quick, lora=True)
    out = {"full_peak_mb": full["peak_mb"], "lora_peak_mb": lora["peak_mb"],
           "lora_memory_ratio": lora["peak_mb"] / full["peak_mb"],
           "full_step_s": full["step_s"], "lora_step_s": lora["step_s"],
           "peak_memory_scope": min(full["scope"], lora["scope"])}
    full, lora = (_in_child(quick, lora=False, checkpointing=True),
                  _in_child(quick, lora=True, checkpointing=True))
    out.update(full_ckpt_peak_mb=full["peak_mb"], lora_ckpt_peak_mb=lora["peak_mb"],
               lora_memory_ratio_checkpointed=lora["peak_mb"] / full["peak_mb"])
    moved = sync(shape)
    out.update(moved)
    out["adapter_sync_vs_full"] = moved["adapter_write_s"] / moved["full_write_s"]
    out["adapter_copy_vs_full"] = moved["adapter_copy_s"] / moved["full_copy_s"]
    return out


def _table(found: dict[str, float]) -> str:
    rows = [("peak memory of one step (MiB)", "full_peak_mb", "lora_peak_mb",
             "lora_memory_ratio"),
            ("same, gradient checkpointing (MiB)", "full_ckpt_peak_mb", "lora_ckpt_peak_mb",
             "lora_memory_ratio_checkpointed"),
            ("step wall time (s)", "full_step_s", "lora_step_s", None),
            ("copy into an engine's own copy (s)", "full_copy_s", "adapter_copy_s",
             "adapter_copy_vs_full"),
            ("write for FileSync (s)", "full_write_s", "adapter_write_s",
             "adapter_sync_vs_full"),
            ("bytes handed over (MiB)", "full_mb", "adapter_mb", None)]
    lines = [f"{'':38} {'full':>10} {'LoRA':>10} {'LoRA/full':>10}"]
    for label, a, b, ratio in rows:
        r = found[ratio] if ratio else found[b] / found[a]
        lines.append(f"{label:38} {found[a]:10.4g} {found[b]:10.4g} {r:10.3g}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a small config")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--step", choices=["full", "lora"], help=argparse.SUPPRESS)
    parser.add_argument("--checkpointing", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.step:  # a child: one step, its figures as the last line
        print(json.dumps(one_step(QUICK if args.quick else SMOL, args.step == "lora",
                                  args.checkpointing)))
        return
    found = figures(args.quick)
    print(json.dumps(found, indent=2) if args.json else _table(found))


if __name__ == "__main__":
    main()
