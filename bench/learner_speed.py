"""gfcr's GRPO learner against a plain PyTorch training loop on the same rows and model.

    PYTHONPATH=$PWD .venv/bin/python bench/learner_speed.py            # table
    PYTHONPATH=$PWD .venv/bin/python bench/learner_speed.py --json     # one JSON object
    PYTHONPATH=$PWD .venv/bin/python bench/learner_speed.py --size gpu --precision bf16

Both sides train the same GRPO-shaped batch (``--prompts`` prompts x ``--group``
samples, prompt and completion lengths drawn at random, so rows differ in length as
they do once a policy stops at EOS) from the same initial weights, in the same process,
alternating trials; each side's time is the median of ``--trials`` updates after one
warm-up. Tokens are the trained tokens, prompt + completion of every row, the same count
for both sides.

- the plain loop: the rows in batch order, micro-batches of ``--micro`` rows padded to
  their longest row, the full model's logits, log-softmax at the completion tokens, a
  policy-gradient loss, backward, gradient clipping and ``torch.optim.AdamW`` with its
  defaults (what a hand-written loop does; ``loss.item()`` once per update);
- gfcr: ``GRPO(micro_batch=4 x micro, micro_batch_tokens=micro x longest row)``'s
  learner (the same memory bound as the plain loop's largest micro-batch):
  micro-batches planned by cost (stages.train.batching), each packed (stages.packing:
  every token once, a group's prompt shared, no padding) or padded after a shared prefix,
  whichever costs less; the chunked head, fused AdamW on CUDA, no host sync per
  micro-batch.

Figures: ``vs_plain_torch`` (gfcr tokens/s over the plain loop's; target >= 1),
``packing_waste`` (padded share of the token slots gfcr's forward runs, 0 in a packed
micro-batch; target < 0.05),
``plain_padding_waste`` (the same share for the plain loop), and on CUDA ``mfu`` and
``plain_mfu`` (6 x parameters x tokens / s over ``--peak-tflops``; the H200's dense bf16
989 by default) and ``peak_mb``. CPU runs use one torch thread (as the HF engine sets)
so two processes sharing a loaded machine do not spin on each other.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
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

from bench._config_llama import ConfigLlama  # noqa: E402
from stages.train.grpo import GRPO  # noqa: E402

SIZES = {
    "cpu": ConfigLlama(layers=4, hidden=256, heads=4, kv_heads=4, intermediate=688, vocab=512),
    "gpu": ConfigLlama(layers=24, hidden=1024, heads=16, kv_heads=16, intermediate=5504,
                       vocab=259),
}
"""cpu: ~3.5M parameters; gpu: the ~0.5B Llama of the first GPU check (byte vocabulary)."""


def rows(prompts: int, group: int, prompt_len: tuple[int, int], completion_len: tuple[int, int],
         vocab: int, seed: int = 0) -> pa.Table:
    """A GRPO batch: ``group`` samples of each prompt, random lengths, rewards that
    differ inside every group (every row has signal) and flat behaviour logprobs."""
    rng = np.random.default_rng(seed)
    data: dict[str, list[Any]] = {k: [] for k in ("reward", "group_id", "prompt_ids",
                                                  "completion_ids", "logprobs")}
    for g in range(prompts):
        prompt = rng.integers(3, vocab, rng.integers(*prompt_len)).tolist()
        for _ in range(group):
            n = int(rng.integers(*completion_len))
            data["reward"].append(float(rng.random()))
            data["group_id"].append(f"g{g}")
            data["prompt_ids"].append(prompt)
            data["completion_ids"].append(rng.integers(3, vocab, n).tolist())
            data["logprobs"].append([-2.0] * n)
    data["logprobs"] = pa.array(data["logprobs"], pa.list_(pa.float32()))
    return pa.table(data)


class Plain:
    """The hand-written loop: padded micro-batches of ``micro`` rows in batch order."""

    def __init__(self, model: torch.nn.Module, micro: int, precision: str) -> None:
        self.model, self.micro, self.precision = model, micro, precision
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
        self.device = next(model.parameters()).device
        self.slots = self.real = 0

    def update(self, batch: pa.Table) -> float:
        prompts = batch.column("prompt_ids").to_pylist()
        comps = batch.column("completion_ids").to_pylist()
        rewards = np.asarray(batch.column("reward").to_pylist())
        groups = np.asarray(batch.column("group_id").to_pylist())
        adv = np.zeros(len(rewards))
        for g in set(groups.tolist()):
            at = groups == g
            adv[at] = (rewards[at] - rewards[at].mean()) / (rewards[at].std() + 1e-6)
        n_tokens = sum(len(c) for c in comps)
        self.optimizer.zero_grad(set_to_none=True)
        total = torch.zeros((), device=self.device)
        for at in range(0, len(prompts), self.micro):
            total += self._micro(prompts[at:at + self.micro], comps[at:at + self.micro],
                                 adv[at:at + self.micro], n_tokens)
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        return float(total)

    def _micro(self, prompts: list[list[int]], comps: list[list[int]], adv: np.ndarray,
               n_tokens: int) -> torch.Tensor:
        seqs = [p + c for p, c in zip(prompts, comps)]
        width = max(len(s) for s in seqs)
        self.slots += len(seqs) * width
        self.real += sum(len(s) for s in seqs)
        ids = torch.zeros((len(seqs), width), dtype=torch.long)
        attn = torch.zeros_like(ids)
        target = torch.zeros((len(seqs), width), dtype=torch.float32)
        for i, (s, p) in enumerate(zip(seqs, prompts)):
            ids[i, :len(s)] = torch.tensor(s)
            attn[i, :len(s)] = 1
            target[i, len(p) - 1:len(s) - 1] = float(adv[i])  # positions predicting completions
        ids, attn, target = ids.to(self.device), attn.to(self.device), target.to(self.device)
        ctx = (torch.autocast(self.device.type, dtype=torch.bfloat16)
               if self.precision == "bf16" else torch.autocast(self.device.type, enabled=False))
        with ctx:
            logits = self.model(input_ids=ids, attention_mask=attn).logits
        logp = torch.log_softmax(logits.float()[:, :-1], -1).gather(-1, ids[:, 1:, None])[..., 0]
        loss = -(logp * target[:, :-1]).sum() / n_tokens
        loss.backward()
        return loss.detach()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def measure(args: argparse.Namespace) -> dict[str, Any]:
    device = torch.device(args.device if args.device != "auto" else
                          ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cpu":
        torch.set_num_threads(1)
    size = SIZES[args.size]
    policy = size.build(seed=0)
    policy.model.to(device)
    plain_model = copy.deepcopy(policy.model)
    batch = rows(args.prompts, args.group, tuple(args.prompt_len), tuple(args.completion_len),
                 size.vocab)
    lengths = [len(p) + len(c) for p, c in zip(batch.column("prompt_ids").to_pylist(),
                                                batch.column("completion_ids").to_pylist())]
    stage = GRPO(lr=1e-5, micro_batch=4 * args.micro,
                 micro_batch_tokens=args.micro * max(lengths), precision=args.precision)
    learner = stage.learner(policy, seed=0)
    plain = Plain(plain_model, args.micro, args.precision)
    times: dict[str, list[float]] = {"gfcr": [], "plain": []}
    metrics: dict[str, float] = {}
    for trial in range(args.trials + 1):  # the first is the warm-up
        for name in ("gfcr", "plain"):
            _sync(device)
            t = time.perf_counter()
            if name == "gfcr":
                metrics = learner.update(None, batch).metrics
            else:
                plain.update(batch)
            _sync(device)
            if trial:
                times[name].append(time.perf_counter() - t)
    tokens = sum(lengths)
    sec = {k: statistics.median(v) for k, v in times.items()}
    out: dict[str, Any] = {
        "vs_plain_torch": sec["plain"] / sec["gfcr"],
        "packing_waste": metrics["packing_waste"],
        "plain_padding_waste": 1 - plain.real / plain.slots,
        "gfcr_tokens_per_s": tokens / sec["gfcr"], "plain_tokens_per_s": tokens / sec["plain"],
        "gfcr_seconds": sec["gfcr"], "plain_seconds": sec["plain"], "tokens": tokens,
        "rows": len(lengths), "params": sum(p.numel() for p in policy.model.parameters()),
        "device": str(device), "precision": args.precision, "micro": args.micro,
        "trials": args.trials, "threads": torch.get_num_threads()}
    if device.type == "cuda":
        flops = 6 * out["params"] * tokens
        out["mfu"] = flops / sec["gfcr"] / (args.peak_tflops * 1e12)
        out["plain_mfu"] = flops / sec["plain"] / (args.peak_tflops * 1e12)
        out["peak_mb"] = metrics.get("peak_memory_mb")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--size", default=None, choices=sorted(SIZES))
    parser.add_argument("--precision", default="fp32", choices=("fp32", "bf16"))
    parser.add_argument("--prompts", type=int, default=None)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, nargs=2, default=(16, 64))
    parser.add_argument("--completion-len", type=int, nargs=2, default=(8, 128))
    parser.add_argument("--micro", type=int, default=16)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--peak-tflops", type=float, default=989.0)
    args = parser.parse_args()
    gpu = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    args.size = args.size or ("gpu" if gpu else "cpu")
    args.prompts = args.prompts or (64 if gpu else 8)
    out = measure(args)
    if args.json:
        print(json.dumps(out))
        return
    print(f"learner speed: {out['rows']} rows, {out['tokens']:,} tokens, "
          f"{out['params']:,} parameters, {out['device']}, {out['precision']}")
    print(f"{'':8} {'tokens/s':>10} {'seconds':>8} {'padding':>8}")
    print(f"{'gfcr':8} {out['gfcr_tokens_per_s']:>10,.0f} {out['gfcr_seconds']:>8.3f} "
          f"{out['packing_waste']:>8.3f}")
    print(f"{'plain':8} {out['plain_tokens_per_s']:>10,.0f} {out['plain_seconds']:>8.3f} "
          f"{out['plain_padding_waste']:>8.3f}")
    print(f"vs_plain_torch {out['vs_plain_torch']:.2f} (target >= 1.0), packing_waste "
          f"{out['packing_waste']:.3f} (target < 0.05)"
          + (f", MFU {out['mfu']:.1%} (plain {out['plain_mfu']:.1%})" if "mfu" in out else ""))


if __name__ == "__main__":
    main()
