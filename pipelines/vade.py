"""VADE: Thompson sampling on per-prompt Beta posteriors with two-scale prior decay.

"VADE: Variance-Aware Dynamic Sampling via Online Sample-Level Difficulty Estimation for
Multimodal RL" on the default task. Each step draws a success rate per prompt from its
Beta posterior (the run's history in the store, discounted with an 8-step half-life,
relaxing towards the run's pass rate of the last couple of steps) and picks the 32
prompts whose draw promises the most mixed groups — selection before rollout instead of
rolling out and discarding flat groups.
"""

from gfcr import Pipeline
from stages import GRPO, VADE, DynamicSampling, GroupSample, Verify
from pipelines.default import LR, SETUP

pipeline = Pipeline(
    name="vade",
    seed=0,
    steps=60,
    **SETUP,
    stages=[
        # --- Replay: 32 prompts by Thompson sampling on Beta posteriors
        VADE(batch=32, rollouts=8, half_life=8.0, prior_half_life=2.0),
        # --- Generate: a group of samples per prompt
        GroupSample(n=8, temperature=1.0, max_tokens=8),
        # --- Filter: score with the task's verifier, drop groups with no signal
        Verify(),
        DynamicSampling(),
        # --- Train: group-normalised advantages, clipped policy gradient
        GRPO(lr=LR),
    ],
)
