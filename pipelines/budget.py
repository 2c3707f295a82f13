"""DUET-style token budgets ("DUET: Optimize Token-Budget Allocation for Reinforcement
Learning with Verifiable Rewards", 2025), with a per-prompt rollout allocator.

Each step may generate 640 tokens: before rollout the budget is split into per-sample
caps by how informative each prompt still is (pass rate near 1/2 in the store's history:
longer caps), and once 640 tokens are spent whatever still runs is pruned. The allocator
spreads 128 samples over the 16 prompts where the pass-rate posterior is least certain.
"""

from gfcr import Pipeline
from stages import GRPO, GroupSample, RolloutAllocator, TokenBudget, UniformSampler, Verify
from pipelines.default import LR, SETUP

pipeline = Pipeline(
    name="budget",
    seed=0,
    steps=40,
    **SETUP,
    stages=[
        # --- Replay: 16 prompts a step
        UniformSampler(batch=16),
        # --- Control: how many samples (128 in all), then how long (640 tokens in all)
        RolloutAllocator(budget=128, rule="uncertainty", min_n=2, max_n=16),
        TokenBudget(budget=640, split="informative", min_tokens=3, abort="prune"),
        # --- Generate: at most 8 tokens a sample; the abort rule looks every 2 tokens
        GroupSample(n=8, temperature=1.0, max_tokens=8, segment_tokens=2),
        # --- Filter and Train
        Verify(),
        GRPO(lr=LR),
    ],
)
