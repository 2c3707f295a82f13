"""The sharded learner against the in-process one: throughput, agreement and memory.

    PYTHONPATH=$PWD .venv/bin/python bench/learner.py            # table
    PYTHONPATH=$PWD .venv/bin/python bench/learner.py --json     # one JSON object
    PYTHONPATH=$PWD .venv/bin/python bench/learner.py --quick    # fewer timed updates

Figures (one run, same batch, same initial weights):

- ``fsdp2_vs_single``: learner tokens per second (prompt + completion tokens of the rows
  trained on, per second of ``Learner.update`` as the loop calls it), 2 FSDP2 processes
  over gloo (gfcr.transport.sharded) over the GRPO learner in this process; median of the timed
  updates after one warm-up. The sharded update includes what the loop pays for it:
  sending the batch, gathering the full weights to rank 0 and writing the version file.
  Each rank runs one torch thread (torchrun's OMP_NUM_THREADS=1), and so does the single
  process for this ratio; ``fsdp2_vs_single_default_threads`` is against the single
  process at torch's default (one thread per core), which on an oversubscribed machine
  measures thread contention more than the learner.
- ``max_weight_diff``: the largest |difference| of any weight after one update from the
  same initial weights, 2 processes against 1.
- ``peak_mb_rank{r}_{n}rank``: peak resident memory of each rank during one full-training
  update (GRPO, AdamW) of a SmolLM2-135M-shaped config-built Llama (30 layers, hidden 576,
  9 heads, 3 KV heads, vocabulary 49,152; 8 rows of 32 tokens), with 2 ranks and with 1
  (the same program unsharded); ``state_mb`` is the fp32 weights + gradients + AdamW
  floor (16 bytes a parameter), ``state_mb_rank{r}_{n}rank`` what each rank holds of it
  (its shards' bytes, counted tensor by tensor). The peak is the resident set, so it
  also holds the libraries and memory the allocator kept after the model was sharded.
- ``lora_memory_ratio`` and ``adapter_sync_vs_full``: from bench/_lora.py when it is
  there (the LoRA learner's benchmark), merged as they come.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

_ROOT = Path(__file__).resolve().parent.parent
# run as a script, bench/ comes first on sys.path and bench/store.py would shadow the
# `store` package: put the repository root there instead
sys.path[:] = [str(_ROOT)] + [p for p in sys.path if Path(p or ".").resolve() != _ROOT / "bench"]

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from bench._config_llama import SMOLLM2, ConfigLlama  # noqa: E402
from gfcr.core.stage import StepContext  # noqa: E402
from gfcr.transport.sharded import Setup, ShardedLearner  # noqa: E402
from stages.engines.hf_sampling import batch_token_logprobs
from stages.train.grpo import GRPO  # noqa: E402

SPEED = ConfigLlama(layers=4, hidden=256, heads=4, kv_heads=4, intermediate=688, vocab=512)
"""The throughput model (~3.5M parameters): big enough that compute, not messaging,
dominates an update on a CPU."""
STAGE = GRPO(lr=1e-5, micro_batch=4)


def batch(policy: Any, *, rows: int, prompt: int, completion: int, vocab: int) -> pa.Table:
    """``rows`` random sequences in groups of 4 with rewards that vary inside each group
    (every row carries signal), behaviour logprobs from ``policy`` (on-policy)."""
    rng = np.random.default_rng(0)
    prompts = [rng.integers(1, vocab, prompt).tolist() for _ in range(rows)]
    comps = [rng.integers(1, vocab, completion).tolist() for _ in range(rows)]
    with torch.no_grad():
        lp, _ = batch_token_logprobs(policy.model, prompts, comps)
    return pa.table({
        "reward": pa.array(rng.random(rows), pa.float64()),
        "group_id": [f"g{i // 4}" for i in range(rows)],
        "prompt_ids": prompts, "completion_ids": comps,
        "logprobs": pa.array([lp[i, :completion].tolist() for i in range(rows)],
                             pa.list_(pa.float32()))})


def ctx(step: int) -> StepContext:
    return StepContext(run_id="bench", step=step, seed=0, policy_version=step, task=None)


def sharded(where: Path, ranks: int, policy: Any) -> ShardedLearner:
    setup = Setup(policy=policy, stage=STAGE, seed=0, run_id="bench",
                  weights=str(where / "weights"), keep=2, device="cpu", offload=False,
                  timeout_s=1800)
    return ShardedLearner(setup, ranks, policy.build(seed=0), where)


def timed(update: Any, table: pa.Table, updates: int) -> float:
    """Median seconds of ``updates`` updates (steps 1.., after the caller's warm-up)."""
    times = []
    for step in range(1, updates + 1):
        start = time.perf_counter()
        update(ctx(step), table)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def throughput(where: Path, updates: int) -> tuple[dict[str, float], ShardedLearner]:
    policy = SPEED.build(seed=0)
    table = batch(policy, rows=16, prompt=32, completion=64, vocab=SPEED.vocab)
    tokens = 16 * (32 + 64)
    single = STAGE.learner(policy, seed=0)
    single.update(ctx(0), table)  # warm-up, and the update the weights are compared after
    after_single = {k: v.clone() for k, v in policy.model.state_dict().items()}
    threads = torch.get_num_threads()
    one_default_s = timed(single.update, table, updates)
    torch.set_num_threads(1)  # as each rank (torchrun's OMP_NUM_THREADS=1)
    try:
        one_s = timed(single.update, table, updates)
    finally:
        torch.set_num_threads(threads)
    group = sharded(where / "two", 2, SPEED)
    _, handle = group.update(ctx(0), table)
    after_two = load_file(str(handle.file))
    two_s = timed(group.update, table, updates)
    diff = max(float((after_two[k] - after_single[k]).abs().max()) for k in after_two)
    return {"single_tokens_per_s": tokens / one_s, "fsdp2_tokens_per_s": tokens / two_s,
            "fsdp2_vs_single": one_s / two_s, "max_weight_diff": diff,
            "single_update_s": one_s, "fsdp2_update_s": two_s,
            "single_default_threads_update_s": one_default_s,
            "fsdp2_vs_single_default_threads": one_default_s / two_s,
            "default_threads": float(threads)}, group


def memory(where: Path, two: ShardedLearner) -> dict[str, float]:
    """Per-rank peak of one SmolLM2-size update, 2 ranks then 1."""
    policy = SMOLLM2.build(seed=0)
    table = batch(policy, rows=8, prompt=16, completion=16, vocab=SMOLLM2.vocab)
    del policy
    out: dict[str, float] = {"state_mb": SMOLLM2.params * 16 / 2**20}
    two.restart(STAGE, SMOLLM2)
    metrics = two.update(ctx(0), table)[0].metrics
    for r in (0, 1):
        out[f"peak_mb_rank{r}_2rank"] = metrics[f"peak_memory_mb/rank{r}"]
        out[f"state_mb_rank{r}_2rank"] = metrics[f"state_mb/rank{r}"]
    two.close()
    one = sharded(where / "one", 1, SMOLLM2)
    try:
        metrics = one.update(ctx(0), table)[0].metrics
    finally:
        one.close()
    out["peak_mb_rank0_1rank"] = metrics["peak_memory_mb"]
    out["state_mb_rank0_1rank"] = metrics["state_mb/rank0"]
    out["peak_2rank_vs_1rank"] = out["peak_mb_rank0_2rank"] / out["peak_mb_rank0_1rank"]
    return out


def lora(quick: bool) -> dict[str, float]:
    """The LoRA benchmark's figures (bench/_lora.py), when that module is there."""
    try:
        module = importlib.import_module("bench._lora")
    except ModuleNotFoundError:
        return {}
    figures: dict[str, float] = module.figures(quick)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--quick", action="store_true", help="2 timed updates, not 5")
    parser.add_argument("--no-memory", action="store_true", help="skip the SmolLM2 part")
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        figures, two = throughput(Path(tmp), 2 if args.quick else 5)
        try:
            if not args.no_memory:
                figures.update(memory(Path(tmp), two))
        finally:
            two.close()
    figures.update(lora(args.quick))
    figures.update({"cpus": float(os.cpu_count() or 0), "load_before": load_before,
                    "load_after": os.getloadavg()[0],
                    "seconds": time.perf_counter() - started})
    if args.json:
        print(json.dumps(figures))
        return
    print(f"{'figure':<28}{'value':>14}")
    for key, value in figures.items():
        print(f"{key:<28}{value:>14.6g}")


if __name__ == "__main__":
    main()
