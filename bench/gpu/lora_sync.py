"""LoRA against full training on one GPU, standalone (torch + transformers + peft +
safetensors only, so it runs where gfcr's own dependencies are not installed).

    python bench/gpu/lora_sync.py            # on the GPU: writes $OUT/lora_sync.json
    python bench/gpu/lora_sync.py --tiny     # a tiny config on CPU: checks the script

For the largest config-built Llama of the list that fits (Llama-3.2-3B's shape, then
1B's, then SmolLM2-135M's; weights fp32, bf16 autocast, gradient checkpointing per layer,
AdamW), one policy-gradient step (the completion tokens' logprobs times a +-1 advantage,
the shape of gfcr's GRPO update) on a batch of ``--rows`` x (``--prompt`` +
``--completion``) tokens:

- ``{full,lora}_peak_gb``: ``torch.cuda.max_memory_allocated`` over a training step
  (weights, gradients, optimizer state, activations); ``lora_memory_ratio`` LoRA / full;
- ``{full,lora}_tokens_per_s``: tokens (prompt + completion) per second of a step,
  median of ``--steps`` steps after one warm-up;
- sync of one version, median of 3: ``*_save_s`` gathers to CPU and writes a
  safetensors file in bf16 (a file sync: every weight, against the adapter alone);
  ``*_d2d_s`` copies into a second bf16 copy of the model on the same GPU (an engine
  with its own weights); ``adapter_sync_vs_full`` is the save's ratio, adapter / full,
  ``adapter_d2d_vs_full`` the copy's.

LoRA: r=16, alpha=32 on every linear layer of a block (gfcr's ``LoraSpec`` default).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch

SHAPES: list[tuple[str, dict[str, int]]] = [
    ("llama-3.2-3b", dict(num_hidden_layers=28, hidden_size=3072, num_attention_heads=24,
                          num_key_value_heads=8, intermediate_size=8192, vocab_size=128256)),
    ("llama-3.2-1b", dict(num_hidden_layers=16, hidden_size=2048, num_attention_heads=32,
                          num_key_value_heads=8, intermediate_size=8192, vocab_size=128256)),
    ("smollm2-135m", dict(num_hidden_layers=30, hidden_size=576, num_attention_heads=9,
                          num_key_value_heads=3, intermediate_size=1536, vocab_size=49152)),
]
TINY = ("tiny", dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=2,
                     num_key_value_heads=1, intermediate_size=128, vocab_size=512))
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def build(shape: dict[str, int], device: str, dtype: torch.dtype = torch.float32) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**shape, max_position_embeddings=4096, tie_word_embeddings=True)
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(config).to(dtype)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


def add_lora(model: Any) -> None:
    from peft import LoraConfig, inject_adapter_in_model

    inject_adapter_in_model(LoraConfig(r=16, lora_alpha=32, target_modules=TARGETS), model)


def batch(vocab: int, rows: int, prompt: int, completion: int, device: str) -> Any:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, vocab, (rows, prompt + completion), generator=g)
    adv = torch.tensor([1.0 if i % 2 else -1.0 for i in range(rows)])
    return ids.to(device), adv.to(device), prompt


def step(model: Any, opt: torch.optim.Optimizer, data: Any, device: str) -> None:
    ids, adv, prompt = data
    with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=device == "cuda"):
        logits = model(input_ids=ids).logits[:, prompt - 1:-1]
    logp = torch.log_softmax(logits.float(), -1).gather(-1, ids[:, prompt:, None])[..., 0]
    loss = -(logp.mean(-1) * adv).mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 1.0)
    opt.step()


def sync_device(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def train(model: Any, data: Any, steps: int, device: str) -> dict[str, float]:
    """Peak memory and tokens per second of training what requires grad."""
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5,
                            fused=device == "cuda")  # fused: no foreach temporaries
    model.train()
    step(model, opt, data, device)  # warm-up; AdamW's state is allocated here
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(steps):
        sync_device(device)
        started = time.perf_counter()
        step(model, opt, data, device)
        sync_device(device)
        times.append(time.perf_counter() - started)
    peak = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else 0.0
    tokens = data[0].numel()
    del opt
    for p in model.parameters():
        p.grad = None
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    return {"peak_gb": peak, "tokens_per_s": tokens / statistics.median(times),
            "step_s": statistics.median(times)}


def median_s(fn: Callable[[], Any], device: str, times: int = 3) -> float:
    spent = []
    for _ in range(times):
        sync_device(device)
        started = time.perf_counter()
        fn()
        sync_device(device)
        spent.append(time.perf_counter() - started)
    return statistics.median(spent)


def save(tensors: dict[str, torch.Tensor], path: Path) -> None:
    """Gather to CPU in bf16 and write safetensors (a file sync)."""
    from safetensors.torch import save_file

    save_file({k: v.detach().to("cpu", torch.bfloat16).contiguous()
               for k, v in tensors.items()}, str(path))


def copy_into(dst: dict[str, torch.Tensor], src: dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        for name, tensor in src.items():
            dst[name].copy_(tensor)


def sync(model: Any, shape: dict[str, int], device: str) -> dict[str, float]:
    """Full state against adapter: to a file, and into a second copy on the device."""
    params = dict(model.named_parameters())
    base = {k: v for k, v in params.items() if ".lora_" not in k}
    adapter = {k: v for k, v in params.items() if ".lora_" in k}
    second = build(shape, device, torch.bfloat16)
    add_lora(second)
    theirs = dict(second.named_parameters())
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        out["full_save_s"] = median_s(lambda: save(base, Path(tmp) / "full.safetensors"),
                                      device)
        out["adapter_save_s"] = median_s(lambda: save(adapter, Path(tmp) / "a.safetensors"),
                                         device)
    out["full_d2d_s"] = median_s(lambda: copy_into(theirs, base), device)
    out["adapter_d2d_s"] = median_s(lambda: copy_into(theirs, adapter), device)
    out["full_gb"] = sum(v.numel() for v in base.values()) * 2 / 2**30
    out["adapter_gb"] = sum(v.numel() for v in adapter.values()) * 2 / 2**30
    del second, theirs
    return out


def run(name: str, shape: dict[str, int], args: argparse.Namespace, device: str
        ) -> dict[str, Any]:
    model = build(shape, device)
    data = batch(shape["vocab_size"], args.rows, args.prompt, args.completion, device)
    full = train(model, data, args.steps, device)
    for p in model.parameters():
        p.requires_grad_(False)
    add_lora(model)  # base frozen, adapter trainable
    lora = train(model, data, args.steps, device)
    found: dict[str, Any] = {"model": name, "params_b": sum(
        p.numel() for n, p in model.named_parameters() if ".lora_" not in n) / 1e9,
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "batch": [args.rows, args.prompt + args.completion]}
    for key in ("peak_gb", "tokens_per_s", "step_s"):
        found[f"full_{key}"], found[f"lora_{key}"] = full[key], lora[key]
    found["lora_memory_ratio"] = lora["peak_gb"] / full["peak_gb"] if full["peak_gb"] else 0.0
    found.update(sync(model, shape, device))
    found["adapter_sync_vs_full"] = found["adapter_save_s"] / found["full_save_s"]
    found["adapter_d2d_vs_full"] = found["adapter_d2d_s"] / found["full_d2d_s"]
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tiny", action="store_true", help="a tiny config on CPU")
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=256)
    parser.add_argument("--completion", type=int, default=256)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    device = "cpu" if args.tiny else "cuda"
    if args.tiny:
        args.prompt, args.completion = min(args.prompt, 16), min(args.completion, 16)
    tried: list[str] = []
    found: dict[str, Any] = {}
    started = time.perf_counter()
    for name, shape in [TINY] if args.tiny else SHAPES:
        try:
            found = run(name, shape, args, device)
            break
        except torch.cuda.OutOfMemoryError as err:
            tried.append(f"{name}: {str(err).splitlines()[0]}")
        gc.collect()  # the failed try's model and optimizer, once its traceback is gone
        torch.cuda.empty_cache()
    found["did_not_fit"] = tried
    found["seconds"] = time.perf_counter() - started
    out = Path(os.environ.get("OUT") or ".") / "lora_sync.json"
    out.write_text(json.dumps(found, indent=2))
    print(json.dumps(found, indent=2))


if __name__ == "__main__":
    main()
