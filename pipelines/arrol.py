"""ARRoL: online rollout pruning ("Prune as You Generate: Online Rollout Pruning for Faster
and Better RLVR", 2025).

A logistic quality head, refitted every step from the run's recent complete rollouts in
the store, predicts from a partial rollout whether it will be right; every two tokens the
most confident members of each group's larger side (likely right or likely wrong) are
pruned until the sides are even, at most half of a group. The step metrics
``pruned_frac`` and ``pruned_token_frac`` say how much was pruned.
"""

from gfcr import Pipeline
from stages import GRPO, GroupSample, OnlinePrune, UniformSampler, Verify
from pipelines.default import LR, SETUP

pipeline = Pipeline(
    name="arrol",
    seed=0,
    steps=40,
    **SETUP,
    stages=[
        # --- Replay: 16 prompts a step
        UniformSampler(batch=16),
        # --- Control: prune towards balanced groups, judged after 2 tokens
        OnlinePrune(max_prune=0.5, min_tokens=2, margin=0.25, window=4),
        # --- Generate: 8 samples per prompt; the hook looks every 2 tokens
        GroupSample(n=8, temperature=1.0, max_tokens=8, segment_tokens=2),
        # --- Filter and Train: survivors are scored and trained as (smaller) groups
        Verify(),
        GRPO(lr=LR),
    ],
)
