"""DOTS+RR: difficulty-targeted prompt selection plus rollout replay.

"Improving Data Efficiency for LLM Reinforcement Fine-tuning Through Difficulty-targeted
Online Data Selection and Rollout Replay" (2025) on the default task. Each step DOTS
predicts every candidate prompt's pass rate — its own history in the store, and for
prompts never tried, the pass rates of the most similar attempted prompts (character
n-gram TF-IDF, attention-style weights) — and draws the 16 nearest to 1/2; Rollout
Replay tops the batch up to 16 groups with signal from the last 4 steps.
"""

from gfcr import Pipeline
from stages import DOTS, GRPO, DynamicSampling, GroupSample, RolloutReplay, Verify
from pipelines.default import LR, SETUP

pipeline = Pipeline(
    name="dots_rr",
    seed=0,
    steps=60,
    **SETUP,
    stages=[
        # --- Replay: 16 prompts of moderate predicted difficulty; replay to 16 kept groups
        DOTS(batch=16, target=0.5, candidates=512, reference=256),
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
