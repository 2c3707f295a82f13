"""bench/real_model.py's baseline: TRL's ``GRPOTrainer`` on the smol pipeline's model,
warm start, task, prompts (the same system and user messages through the same chat
template), group size, completion length, learning rate and clipping, one optimizer
step per batch of ``batch`` prompts x ``n`` samples, on one CPU thread as gfcr's HF
engine. Per step: wall seconds and the process's peak resident memory (``VmHWM`` reset
at the step's start, as gfcr's learner reports it: stages.train.memory).

Loaded by path from bench/real_model.py (needs ``trl``; bench only).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any


def _warm_policy(args: Any) -> tuple[Any, Any, Any, str]:
    """(policy, task, pipeline, system message): the smol pipeline's policy after its
    cached warm start (seed 0, the file bench/real_model.py's gfcr runs use)."""
    from gfcr.core.loading import load

    pipeline = load("smol").with_overrides([f"policy.root={args.models}"])
    policy = pipeline.policy.build(seed=0)
    pipeline.warmstart.run(policy, pipeline.task, seed=0, cache_dir=Path(args.cache))
    return policy, pipeline.task, pipeline, pipeline.policy.system


def _dataset(task: Any, system: str) -> Any:
    from datasets import Dataset

    rows = task.train_prompts().to_pylist()
    return Dataset.from_list([{"prompt": [{"role": "system", "content": system},
                                          {"role": "user", "content": r["prompt"]}],
                               "answer": r["answer"], "meta": r["meta"]} for r in rows])


class _StepMeter:
    """A TrainerCallback measuring each optimizer step's wall time and peak memory."""

    def __init__(self) -> None:
        from stages.train.memory import PeakMemory
        import torch

        self.peak = PeakMemory(torch.device("cpu"))
        self.seconds: list[float] = []
        self.memory: list[float] = []
        self.t0 = 0.0

    def on_step_begin(self, *a: Any, **k: Any) -> None:
        self.peak.__enter__()
        self.t0 = time.perf_counter()

    def on_step_end(self, *a: Any, **k: Any) -> None:
        self.seconds.append(time.perf_counter() - self.t0)
        self.peak.__exit__()
        self.memory.append(self.peak.mb)

    def __getattr__(self, name: str) -> Any:  # every other callback event: nothing
        if name.startswith("on_"):
            return lambda *a, **k: None
        raise AttributeError(name)


def run_trl(args: Any) -> dict[str, Any]:
    import torch
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(1)
    policy, task, pipeline, system = _warm_policy(args)
    grpo = pipeline.stages[-1]
    lr = args.lr if args.lr is not None else grpo.lr

    def reward(completions: list[Any], answer: list[str], meta: list[str], **_: Any
               ) -> list[float]:
        return [task.score(c[0]["content"] if isinstance(c, list) else c, a, m)
                for c, a, m in zip(completions, answer, meta)]

    meter = _StepMeter()
    with tempfile.TemporaryDirectory(prefix="gfcr-trl-") as tmp:
        config = GRPOConfig(
            output_dir=tmp, learning_rate=lr, lr_scheduler_type="constant",
            weight_decay=0.0, max_grad_norm=grpo.max_grad_norm,
            num_generations=args.n, per_device_train_batch_size=args.batch * args.n,
            generation_batch_size=args.batch * args.n, gradient_accumulation_steps=1,
            max_completion_length=args.max_tokens, temperature=1.0, beta=0.0,
            epsilon=grpo.clip_low, epsilon_high=grpo.clip_high, loss_type="grpo",
            num_iterations=1, max_steps=args.trl_steps or args.steps, seed=args.seed,
            logging_steps=1, report_to=[], save_strategy="no", use_cpu=True, bf16=False,
            disable_dropout=True, remove_unused_columns=False, dataloader_num_workers=0)
        trainer = GRPOTrainer(model=policy.model, reward_funcs=reward, args=config,
                              train_dataset=_dataset(task, system),
                              processing_class=policy.tokenizer.hf, callbacks=[meter])
        started = time.perf_counter()
        trainer.train()
    return {"engine": "trl", "seed": args.seed, "step_seconds": meter.seconds,
            "peak_memory_mb": meter.memory, "run_seconds": time.perf_counter() - started,
            "rewards": [h.get("reward") for h in trainer.state.log_history if "reward" in h]}
