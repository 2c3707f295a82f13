"""One colocated GRPO run on one GPU: the HF engine and the learner on the same device.

    PYTHONPATH=$PWD python bench/gpu_step.py --json            # on a CUDA machine

A ~0.5B config-built Llama (hidden 1024, 24 layers, MLP 5504, byte vocabulary: the first
GPU check's model, ../shared/gpu/pipe.py) generates ``--batch`` prompts x ``--n`` samples
of at most ``--max-tokens`` tokens and trains on them with GRPO in bf16 for ``--steps``
steps, through ``gfcr.execute(executor="local")`` (no Prefect). Figures are the steps
after the first (warm-up): step, generation and training seconds, trained tokens per
second of the train stage, the learner's MFU (6 x parameters x trained tokens over
``--peak-tflops``, the H200's dense bf16 989 by default), ``packing_waste`` and the CUDA
peak of the process. On a machine without CUDA it says so and exits 0 with
``{"skipped": ...}``. vLLM is not on a bare GPU machine, so the engine is HF's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

_ROOT = Path(__file__).resolve().parent.parent
sys.path[:] = [str(_ROOT)] + [p for p in sys.path if Path(p or ".").resolve() != _ROOT / "bench"]

import torch  # noqa: E402


def pipeline(args: argparse.Namespace) -> Any:
    from gfcr import Evaluation, Pipeline
    from gfcr.core.settings import Checkpointing
    from stages import GRPO, HF, GroupSample, ReasoningGym, TinyLlama, UniformSampler, Verify

    policy = TinyLlama(hidden_size=1024, num_layers=24, num_heads=16, intermediate_size=5504,
                       max_position=512)
    task = ReasoningGym(dataset="chain_sum", train_size=3000, heldout_size=64,
                        config={"min_terms": 3, "max_terms": 3, "min_digits": 1,
                                "max_digits": 1})
    return Pipeline(
        name="gpu-step", seed=0, steps=args.steps, task=task, policy=policy,
        engine=HF(device="cuda", dtype="bfloat16", max_batch=512),
        evaluation=Evaluation(size=16, max_tokens=8), checkpoint=Checkpointing(every=0, keep=1),
        stages=[UniformSampler(batch=args.batch),
                GroupSample(n=args.n, temperature=1.0, max_tokens=args.max_tokens), Verify(),
                # entropy_coef > 0: every row trains (an untrained policy scores flat groups)
                GRPO(lr=1e-5, precision="bf16", micro_batch=512, micro_batch_tokens=65536,
                     entropy_coef=1e-4)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--peak-tflops", type=float, default=989.0)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print(json.dumps({"skipped": "torch sees no CUDA device"}))
        return
    from gfcr import execute

    spec = pipeline(args)
    with tempfile.TemporaryDirectory() as root:
        summary = execute(spec, root=Path(root), executor="local")
    later = summary.history[1:] or summary.history
    params = 259 * 1024 + 24 * (4 * 1024 * 1024 + 3 * 1024 * 5504 + 2 * 1024) + 1024

    def med(key: str) -> float:
        return statistics.median(float(h.get(key, float("nan"))) for h in later)

    trained = med("train/n_tokens")  # completion tokens with a loss
    out = {"steps": summary.steps, "params": params, "step_seconds": med("step_seconds"),
           "generate_seconds": med("time/group"), "train_seconds": med("time/grpo"),
           "trained_completion_tokens": trained,
           "train_peak_mb": med("train/peak_memory_mb"),
           "packing_waste": med("train/packing_waste"),
           "cuda_max_allocated_mb": torch.cuda.max_memory_allocated() / 2**20,
           "device": torch.cuda.get_device_name(0)}
    out["mfu_completion_tokens"] = (6 * params * trained / out["train_seconds"]
                                    / (args.peak_tflops * 1e12))
    print(json.dumps(out) if args.json else "\n".join(f"{k}: {v}" for k, v in out.items()))


if __name__ == "__main__":
    main()
