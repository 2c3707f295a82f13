"""ADHint + XRPO seeding: help the prompts the policy keeps failing.

Half of each group starts from a prefix of the reference answer whose length grows with
the prompt's difficulty in the store's history (ADHint); a prompt failed 8 times in a
row gets two solved prompts with their answers prepended (XRPO's in-context seeding).
Forced tokens are marked in ``hint_tokens`` for the trainer to mask, seeded prompts in
``exemplars``.
"""

from gfcr import Pipeline
from stages import (GRPO, ConditionedSample, DynamicSampling, Exemplars, GroupSample,
                    Hints, UniformSampler, Verify)
from pipelines.default import LR, SETUP

pipeline = Pipeline(
    name="hints",
    seed=0,
    steps=40,
    **SETUP,
    stages=[
        # --- Replay
        UniformSampler(batch=16),
        # --- Generate: groups of 8, hinted and seeded by difficulty
        ConditionedSample(sample=GroupSample(n=8, temperature=1.0, max_tokens=8),
                          # answers are 1-3 characters: up to all but the last one
                          hints=Hints(max_ratio=1.0, share=0.5),
                          exemplars=Exemplars(k=2, after=8)),
        # --- Filter
        Verify(),
        DynamicSampling(),
        # --- Train
        GRPO(lr=LR),
    ],
)
