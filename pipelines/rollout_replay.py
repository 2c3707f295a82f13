"""Rollout Replay: half the batch newly generated, the rest replayed from the store.

The RR half of DOTS+RR ("Improving Data Efficiency for LLM Reinforcement Fine-tuning
Through Difficulty-targeted Online Data Selection and Rollout Replay", 2025) on the
default task: 16 new prompts a step instead of 32, and the batch topped up to 16 groups
with signal from the groups the run kept and trained on in the last 4 steps (each at
most twice). Replayed rows keep their behaviour logprobs, so GRPO's clipped ratio is
taken against the policy that generated them; MLflow gets replay/rows, replay/share and
replay/staleness_* every step.
"""

from gfcr import Pipeline
from stages import (GRPO, DynamicSampling, GroupSample, RolloutReplay, UniformSampler,
                    Verify)
from pipelines.default import LR, SETUP

pipeline = Pipeline(
    name="rollout_replay",
    seed=0,
    steps=60,
    **SETUP,
    stages=[
        # --- Replay: 16 new prompts; after filtering, replay recent groups up to 16 kept
        UniformSampler(batch=16),
        RolloutReplay(groups=16, max_share=0.5, window=4, max_replays=2),
        # --- Generate: a group of samples per prompt
        GroupSample(n=8, temperature=1.0, max_tokens=8),
        # --- Filter: score with the task's verifier, drop groups with no signal
        Verify(),
        DynamicSampling(),
        # --- Train: GRPO; replayed rows are off-policy, corrected by their stored logprobs
        GRPO(lr=LR),
    ],
)
