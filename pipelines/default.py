"""The embedded default: GRPO on three-term one-digit sums with a tiny Llama, on a CPU.

A reasoning-gym procedural task (``chain_sum``: "State the final answer to the following
arithmetic problem: 4 + 7 - 2 =") whose own scorer is the verifier; a ~0.7M-parameter
Llama-architecture policy built from a config with a byte-level tokenizer; a short
supervised warm start on the task's reference answers (cached, so a second run skips
it); then GRPO with dynamic sampling. ``gfcr run`` runs it.

Why this task: after the warm start the policy is right on most held-out prompts
greedily (81% with the byte tokenizer; 72-78% with the character one, as float rounding
differs by CPU model) and samples the right answer at
temperature 1 about half the time, so a group of 8 nearly always has signal and GRPO
raises held-out accuracy. On two-term 1-2 digit sums the same policy reaches ~10-14%
after the warm start, samples ~7% correct, and every GRPO-family estimator lost
held-out accuracy (BENCHMARKS.md, "Learning").
"""

from gfcr import Evaluation, Pipeline
from stages import (GRPO, HF, SFT, DynamicSampling, GroupSample, ReasoningGym, TinyLlama,
                    UniformSampler, Verify)

# --- where prompts come from, and who answers them
task = ReasoningGym(dataset="chain_sum", train_size=3000, heldout_size=512,
                    config={"min_terms": 3, "max_terms": 3, "min_digits": 1, "max_digits": 1})
policy = TinyLlama()

SETUP = dict(task=task, policy=policy, engine=HF(device="cpu"),
             warmstart=SFT(steps=300, batch_size=256, schedule="cosine"),
             evaluation=Evaluation(size=512, max_tokens=8))
"""The task, policy, engine, warm start and evaluation every ready pipeline shares, so
they all start from the same cached warm start and are measured the same way.

The task has 4,000 distinct problems (10^3 operand triples x 4 sign pairs): 3,000 train,
512 of the rest held out. The warm start is 300 steps of 256 examples with a
cosine-annealed learning rate (about two minutes on one core); 512 held-out prompts put
one standard error of the accuracy at about 1.8 points near 80%."""

LR = 1e-5
"""GRPO's learning rate in every ready pipeline. On the default 1e-5 gains ~5 points of
held-out accuracy in 40 steps (3 seeds, BENCHMARKS.md "Learning"); 3e-5 gains and then
loses it within 60 steps; 1e-4 loses ~10 points in 10 steps."""

pipeline = Pipeline(
    name="default",
    seed=0,
    steps=40,
    **SETUP,
    stages=[
        # --- Replay: which prompts this step
        UniformSampler(batch=32),
        # --- Generate: a group of samples per prompt
        GroupSample(n=8, temperature=1.0, max_tokens=8),
        # --- Filter: score with the task's own verifier, drop groups with no signal
        Verify(),
        DynamicSampling(),
        # --- Train: group-normalised advantages, clipped policy gradient
        GRPO(lr=LR),
    ],
)
