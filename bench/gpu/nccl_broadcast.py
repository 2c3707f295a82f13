"""NCCL broadcast time of one weights version, trainer rank -> engine rank (issue 24).

What the fleet's GPU weight sync costs per version: the trainer (rank 0) broadcasts the
policy's state dict, packed into buckets of at most ``--bucket-mib`` as vLLM's NCCL
weight-transfer engine packs them, to an engine (rank 1). The shapes are those of
config-built models (transformers' LlamaConfig on the meta device; no weights are
downloaded or initialised: the time of a broadcast depends on its bytes only), in bf16:
SmolLM2-135M's, SmolLM2-1.7B's, a Llama-7B shape and a 14B shape (Qwen2.5-14B's layer
sizes), the largest whose two copies fit one 80 GB H100.

Two ranks on one GPU: NCCL refuses two ranks on the same device in most versions
("Duplicate GPU detected"). The script tries (in two spawned processes, bounded by
``--nccl-timeout``) and, when NCCL refuses or hangs, measures a device-to-device copy of
the same buckets in one process instead and says so in the JSON (``backend``:
"d2d-copy", ``nccl_error``). That copy is an upper bound of what a broadcast between two
GPUs of one host can reach, not a broadcast; bench/scale.py takes ``gb_s`` of the
``--model-for-scale`` entry as its broadcast bandwidth only when ``backend`` is "nccl",
and says which it used.

    python bench/gpu/nccl_broadcast.py                 # on the GPU machine (< 3 min)
    python bench/gpu/nccl_broadcast.py --cpu           # here: gloo, float32, tiny shapes

Writes ``$OUT/nccl_broadcast.json`` (or ``--out``) and prints it. Standalone: torch,
transformers and the standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time
import traceback
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

GPU_MODELS: dict[str, dict[str, Any]] = {
    "smollm2-135m": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, vocab_size=49152,
                         tie_word_embeddings=True),
    "smollm2-1.7b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=24,
                         num_attention_heads=32, num_key_value_heads=32, vocab_size=49152,
                         tie_word_embeddings=True),
    "llama-7b": dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                     num_attention_heads=32, num_key_value_heads=32, vocab_size=32000,
                     tie_word_embeddings=False),
    "14b": dict(hidden_size=5120, intermediate_size=13824, num_hidden_layers=48,
                num_attention_heads=40, num_key_value_heads=8, vocab_size=152064,
                tie_word_embeddings=False),
}
CPU_MODELS: dict[str, dict[str, Any]] = {
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=2, num_key_value_heads=2, vocab_size=256,
                 tie_word_embeddings=True),
    "smollm2-135m": GPU_MODELS["smollm2-135m"],
}


def shapes(fields: dict[str, Any]) -> list[tuple[str, tuple[int, ...]]]:
    """The parameters (tied ones once) of a Llama-architecture model built from config."""
    from transformers import LlamaConfig, LlamaForCausalLM

    with torch.device("meta"):
        model = LlamaForCausalLM(LlamaConfig(**fields))
    return [(name, tuple(p.shape)) for name, p in model.named_parameters()]


def buckets(numel: int, dtype: torch.dtype, device: str, bucket_mib: int) -> list[torch.Tensor]:
    """``numel`` elements as flat buffers of at most ``bucket_mib`` MiB each."""
    per = max(1, bucket_mib * 2**20 // torch.empty((), dtype=dtype).element_size())
    sizes = [per] * (numel // per) + ([numel % per] if numel % per else [])
    return [torch.empty(n, dtype=dtype, device=device) for n in sizes]


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _rank(rank: int, args: argparse.Namespace, port: int, result: Any) -> None:
    """One rank: broadcast every model's buckets from rank 0, ``repeats`` times each."""
    backend, device = ("gloo", "cpu") if args.cpu else ("nccl", "cuda:0")
    dtype = torch.float32 if args.cpu else torch.bfloat16
    if device.startswith("cuda"):
        torch.cuda.set_device(0)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2, timeout=__import__("datetime").timedelta(
                                seconds=args.nccl_timeout))
    rows = []
    for name, fields in _models(args).items():
        numel = sum(_numel(s) for _, s in shapes(fields))
        bufs = buckets(numel, dtype, device, args.bucket_mib)
        for b in bufs:
            b.fill_(1.0 if rank == 0 else 0.0)
        dist.broadcast(bufs[0][:1024], src=0)  # warm-up: the communicator's first use
        _sync(device)
        times = []
        for _ in range(args.repeats):
            started = time.perf_counter()
            for b in bufs:
                dist.broadcast(b, src=0)
            _sync(device)
            times.append(time.perf_counter() - started)
        ok = all(bool((b == 1.0).all()) for b in bufs)
        rows.append(_row(name, numel, dtype, times, ok, len(bufs)))
        del bufs
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        result.put(rows)


def _models(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    every = CPU_MODELS if args.cpu else GPU_MODELS
    return {k: v for k, v in every.items() if not args.models or k in args.models}


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _row(name: str, numel: int, dtype: torch.dtype, times: list[float], ok: bool,
         n_buckets: int) -> dict[str, Any]:
    size = numel * torch.empty((), dtype=dtype).element_size()
    seconds = statistics.median(times)
    return {"model": name, "params": numel, "bytes": size, "dtype": str(dtype).split(".")[-1],
            "buckets": n_buckets, "seconds_per_version": seconds, "times": times,
            "gb_s": size / seconds / 1e9, "received_intact": ok}


def copy_fallback(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Device-to-device copies of the same buckets in one process (not a broadcast)."""
    rows = []
    for name, fields in _models(args).items():
        numel = sum(_numel(s) for _, s in shapes(fields))
        src = buckets(numel, torch.bfloat16, "cuda:0", args.bucket_mib)
        dst = buckets(numel, torch.bfloat16, "cuda:0", args.bucket_mib)
        for b in src:
            b.fill_(1.0)
        times = []
        for _ in range(args.repeats + 1):
            torch.cuda.synchronize()
            started = time.perf_counter()
            for s, d in zip(src, dst):
                d.copy_(s, non_blocking=True)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - started)
        ok = all(bool((d == 1.0).all()) for d in dst)
        rows.append(_row(name, numel, torch.bfloat16, times[1:], ok, len(src)))
        del src, dst
        torch.cuda.empty_cache()
    return rows


def try_broadcast(args: argparse.Namespace) -> tuple[list[dict[str, Any]] | None, str | None]:
    """The two-rank broadcast in spawned processes; (rows, None) or (None, why not)."""
    ctx = mp.get_context("spawn")
    result = ctx.Queue()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [ctx.Process(target=_guarded, args=(r, args, port, result)) for r in range(2)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + args.deadline
    rows = None
    while time.monotonic() < deadline and rows is None:
        try:
            rows = result.get(timeout=1.0)
        except Exception:  # queue.Empty: not yet
            if all(p.exitcode is not None for p in procs):
                break
    for p in procs:
        p.join(timeout=5)
        if p.is_alive():
            p.kill()
    if isinstance(rows, list):
        return rows, None
    why = rows if isinstance(rows, str) else f"no result within the deadline (exit codes " \
                                              f"{[p.exitcode for p in procs]})"
    return None, why


def _guarded(rank: int, args: argparse.Namespace, port: int, result: Any) -> None:
    try:
        _rank(rank, args, port, result)
    except Exception as err:  # NCCL's refusal of two ranks on one GPU lands here
        result.put(f"rank {rank}: {type(err).__name__}: {err}"[:2000])
        traceback.print_exc()
        sys.exit(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpu", action="store_true", help="gloo on CPU, tiny shapes")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--bucket-mib", type=int, default=1024)
    parser.add_argument("--nccl-timeout", type=float, default=60.0,
                        help="NCCL's own timeout for a collective, s")
    parser.add_argument("--deadline", type=float, default=90.0,
                        help="give up on the two-rank broadcast after this many s")
    parser.add_argument("--models", nargs="*", default=None,
                        help=f"a subset of {sorted(GPU_MODELS)} (--cpu: {sorted(CPU_MODELS)})")
    parser.add_argument("--out", default=None, help="default: $OUT/nccl_broadcast.json")
    args = parser.parse_args()
    started = time.perf_counter()
    rows, why = try_broadcast(args)
    backend = "gloo" if args.cpu else "nccl"
    if rows is None and not args.cpu:
        rows, backend = copy_fallback(args), "d2d-copy"
    report = {"device": "cpu" if args.cpu else torch.cuda.get_device_name(0),
              "torch": torch.__version__, "backend": backend, "nccl_error": why,
              "note": ("two ranks on one GPU: a broadcast between them" if backend == "nccl"
                       else "NCCL refused two ranks on one GPU: device-to-device copies "
                            "of the same buckets instead (an upper bound, not a broadcast)"
                       if backend == "d2d-copy" else "gloo on CPU (the script's own test)"),
              "models": rows or [], "wall_s": time.perf_counter() - started}
    out = args.out or os.path.join(os.environ.get("OUT", "."), "nccl_broadcast.json")
    with open(out, "w") as f:
        json.dump(report, f, indent=1)
    print(json.dumps(report, indent=1))
    if not rows:
        sys.exit(1)


if __name__ == "__main__":
    main()
