"""Per-prompt rollout allocation under a fixed budget (XRPO's uncertainty-driven
allocator; "XRPO: Pushing the limits of GRPO with Targeted Exploration and
Exploitation", 2025).

Every step spends exactly 128 samples over 24 prompts; each extra sample goes to the
prompt whose Beta pass-rate posterior (from the store's history) it makes most certain.
``rule="sqrt"`` gives Rollout-GDRO's square-root rule, ``rule="hard"`` DARS's tilt
towards hard prompts, at the same cost.
"""

from gfcr import Pipeline
from stages import GRPO, GroupSample, RolloutAllocator, UniformSampler, Verify
from pipelines.default import LR, SETUP

pipeline = Pipeline(
    name="allocate",
    seed=0,
    steps=40,
    **SETUP,
    stages=[
        # --- Replay: 24 prompts a step
        UniformSampler(batch=24),
        # --- Control: 128 samples in all, 2 to 16 per prompt, where they teach most
        RolloutAllocator(budget=128, rule="uncertainty", min_n=2, max_n=16),
        # --- Generate: the group size comes from the plan
        GroupSample(n=8, temperature=1.0, max_tokens=8),
        # --- Filter and Train
        Verify(),
        GRPO(lr=LR),
    ],
)
