"""FSDP2 on the lent GPU: the largest config-built Llama that trains with bf16 mixed
precision and fp32 AdamW, its tokens per second and peak memory, and the time to gather
its full state dict to CPU (what the sharded learner, gfcr.transport.sharded, pays once per weight
version to publish the weights).

    torchrun --nproc-per-node 1 bench/gpu/fsdp2.py --out $OUT/fsdp2.json
    torchrun --nproc-per-node 2 bench/gpu/fsdp2.py --tiny --out /tmp/fsdp2.json  # CPU, gloo

Standalone: torch and transformers only (the GPU host has no gfcr dependencies), the same
recipe as stages.train.fsdp: ``fully_shard`` per decoder layer and on the root,
``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``, gradients summed, AdamW
over the fp32 shards. One GPU means world size 1 (NCCL refuses two ranks on one device),
so the model is not split: the figure is how large a model one H100 trains this way
(16 bytes per parameter of fp32 weights, gradients and AdamW moments, plus bf16
activations). Candidates are tried largest first; one that runs out of memory is freed
and the next tried. ``--offload`` keeps shards and optimizer state in CPU memory
(CPUOffloadPolicy) instead.

Prints a table and writes the JSON (``--out``); stops trying candidates after
``--budget-s`` seconds.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import time
from datetime import timedelta
from typing import Any

os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")  # retries after OOM

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed.checkpoint.state_dict import (  # noqa: E402
    StateDictOptions, get_model_state_dict)
from torch.distributed.fsdp import (CPUOffloadPolicy, FSDPModule,  # noqa: E402
                                    MixedPrecisionPolicy, OffloadPolicy, fully_shard)
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

# (name, layers, hidden, heads, kv heads, intermediate, vocab), largest first
GPU_MODELS = [
    ("llama-6.7b", 32, 4096, 32, 32, 11008, 32000),
    ("llama-4.5b", 32, 3584, 28, 4, 9728, 32000),
    ("llama-3.2b", 28, 3072, 24, 8, 8192, 128256),
    ("llama-1.2b", 16, 2048, 32, 8, 8192, 128256),
    ("smollm2-360m", 32, 960, 15, 5, 2560, 49152),
]
TINY_MODELS = [("tiny-2m", 2, 128, 4, 2, 256, 512)]


def _config(spec: tuple) -> LlamaConfig:
    _, layers, hidden, heads, kv, inter, vocab = spec
    return LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter,
                       num_hidden_layers=layers, num_attention_heads=heads,
                       num_key_value_heads=kv, max_position_embeddings=4096,
                       tie_word_embeddings=False, attn_implementation="sdpa")


def _floor_gb(spec: tuple) -> float:
    """fp32 weights, gradients and AdamW's two moments: 16 bytes a parameter."""
    _, layers, hidden, heads, kv, inter, vocab = spec
    attn = 2 * hidden * hidden + 2 * hidden * (hidden // heads) * kv
    return 16 * (layers * (attn + 3 * hidden * inter) + 2 * vocab * hidden) / 1e9


def _build(spec: tuple, device: torch.device, offload: bool) -> torch.nn.Module:
    """Built on the device (fast initialisation), then sharded."""
    torch.manual_seed(0)
    with torch.device("cpu" if offload else device):
        model = LlamaForCausalLM(_config(spec)).float()
    mixed = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) \
        if device.type == "cuda" else MixedPrecisionPolicy()
    place = CPUOffloadPolicy() if offload else OffloadPolicy()
    for layer in model.model.layers:
        fully_shard(layer, mp_policy=mixed, offload_policy=place)
    fully_shard(model, mp_policy=mixed, offload_policy=place)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)
    return model


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _train(model: torch.nn.Module, device: torch.device, *, batch: int, seq: int,
           steps: int, vocab: int) -> dict[str, float]:
    """One warm-up step, then ``steps`` timed AdamW steps on random tokens (causal LM
    loss: the forward and backward a GRPO update runs, at this batch shape)."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=device.type == "cuda")
    gen = torch.Generator().manual_seed(dist.get_rank())
    ids = torch.randint(0, vocab, (batch, seq), generator=gen).to(device)
    times = []
    for i in range(steps + 1):
        _sync(device)
        start = time.perf_counter()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        _sync(device)
        if i:
            times.append(time.perf_counter() - start)
    step_s = sorted(times)[len(times) // 2]
    world = dist.get_world_size()
    return {"step_s": step_s, "tokens_per_s": batch * seq * world / step_s,
            "loss": float(loss.detach())}


def _gather(model: torch.nn.Module, device: torch.device) -> dict[str, float]:
    """The full state dict on rank 0 in CPU memory, as the sharded learner gathers it
    once per published version."""
    _sync(device)
    start = time.perf_counter()
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True,
                                                                 cpu_offload=True))
    _sync(device)
    seconds = time.perf_counter() - start
    size = sum(t.numel() * t.element_size() for t in state.values())
    return {"gather_full_state_s": seconds, "gather_gb": size / 1e9}


def _attempt(spec: tuple, device: torch.device, args: argparse.Namespace) -> dict[str, Any]:
    row: dict[str, Any] = {"model": spec[0], "state_floor_gb": _floor_gb(spec)}
    model = None
    if device.type == "cuda" and not args.offload:
        total = torch.cuda.mem_get_info(device)[1] / 1e9
        if row["state_floor_gb"] > 0.95 * total:
            row.update(fits=False, error=f"skipped: its state alone needs "
                       f"{row['state_floor_gb']:.0f} GB of {total:.0f} GB")
            return row
    try:
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        model = _build(spec, device, args.offload)
        row["params_b"] = sum(p.numel() for p in model.parameters()) / 1e9  # global
        row.update(_train(model, device, batch=args.batch, seq=args.seq, steps=args.steps,
                          vocab=spec[-1]))
        if device.type == "cuda":
            row["peak_memory_gb"] = torch.cuda.max_memory_allocated(device) / 1e9
        row.update(_gather(model, device))
        row["fits"] = True
    except torch.OutOfMemoryError as err:
        row.update(fits=False, error=f"out of memory: {str(err).splitlines()[0][:160]}")
    finally:
        del model
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return row


def _agreed(fits: bool) -> bool:
    """Every rank fitted (one rank out of memory means the candidate does not fit)."""
    flag = torch.tensor([int(fits)], device="cuda" if dist.get_backend() == "nccl" else "cpu")
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=None, help="write the JSON here")
    parser.add_argument("--tiny", action="store_true", help="CPU, gloo, a 2M model")
    parser.add_argument("--offload", action="store_true", help="CPUOffloadPolicy")
    parser.add_argument("--batch", type=int, default=None)
    parser.add_argument("--seq", type=int, default=None)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--budget-s", type=float, default=170.0)
    args = parser.parse_args()
    started = time.perf_counter()
    cuda = torch.cuda.is_available() and not args.tiny
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if cuda:
        torch.cuda.set_device(local)
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    dist.init_process_group("nccl" if cuda else "gloo", timeout=timedelta(seconds=300))
    args.batch = args.batch or (4 if cuda else 2)
    args.seq = args.seq or (1024 if cuda else 32)
    rows = []
    for spec in (GPU_MODELS if cuda else TINY_MODELS):
        if time.perf_counter() - started > args.budget_s:
            rows.append({"model": spec[0], "fits": None, "error": "time budget spent"})
            break
        row = _attempt(spec, device, args)
        row["fits"] = _agreed(bool(row.get("fits")))
        rows.append(row)
        if row["fits"]:
            break
    best = next((r for r in rows if r.get("fits")), None)
    report = {"device": torch.cuda.get_device_name(device) if cuda else "cpu",
              "backend": dist.get_backend(), "world_size": dist.get_world_size(),
              "offload": args.offload, "batch": args.batch, "seq": args.seq,
              "mixed_precision": "bf16 params, fp32 reduce" if cuda else "fp32",
              "torch": torch.__version__, "largest": best, "attempts": rows,
              "seconds": time.perf_counter() - started}
    if dist.get_rank() == 0:
        for r in rows:
            print(f"{r['model']:>14}  fits={r.get('fits')!s:5}  "
                  f"params={r.get('params_b', 0):6.2f}B  "
                  f"tok/s={r.get('tokens_per_s', 0):10.0f}  "
                  f"peak={r.get('peak_memory_gb', 0):6.1f}GB  "
                  f"gather={r.get('gather_full_state_s', 0):6.2f}s  {r.get('error', '')}")
        if args.out:
            os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
            with open(args.out, "w") as f:
                json.dump(report, f, indent=2)
        print(json.dumps({k: v for k, v in report.items() if k != "attempts"}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
