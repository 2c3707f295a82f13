"""DAPO: dynamic sampling that refills the batch, soft overlong punishment, clip-higher
and a token-level loss (Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning
System at Scale").

Groups whose rewards are all equal are dropped and more prompts are drawn, up to three
extra rounds, until 16 groups with signal are kept; a completion running into the last 4
of its 8 tokens loses up to 1 reward (DAPO's R_length). The penalty makes rewards
continuous; dynamic sampling judges groups by their spread, so that is fine.
"""

from gfcr import Pipeline
from stages import GRPO, DynamicSampling, GroupSample, Overlong, UniformSampler, Verify
from pipelines.default import LR, SETUP

pipeline = Pipeline(
    name="dapo",
    seed=0,
    steps=40,
    **SETUP,
    stages=[
        # --- Replay: 16 prompts, more in refill rounds
        UniformSampler(batch=16),
        # --- Generate: 8 samples per prompt, at most 8 tokens
        GroupSample(n=8, temperature=1.0, max_tokens=8),
        # --- Filter: verify, punish overlong answers softly, refill until 16 groups count
        Verify(),
        Overlong(mode="penalty", max_tokens=8, buffer=4),
        DynamicSampling(mode="refill", min_groups=16, max_rounds=3),
        # --- Train: clip-higher (0.2 / 0.28), loss averaged over tokens
        GRPO(lr=LR, clip_low=0.2, clip_high=0.28, aggregation="token_mean"),
    ],
)
