"""Prompt-GDRO: multiplicative weights over difficulty groups.

"Group Distributionally Robust Optimization-Driven Reinforcement Learning for LLM
Reasoning" (Prompt-GDRO) on the default task. Prompts are binned by their posterior pass
rate from the run's history in the store; a multiplicative-weights sampler moves
probability towards bins whose (EMA-debiased) failure rate stays high, with 20% uniform
exploration so no bin is starved.
"""

from gfcr import Pipeline
from stages import GRPO, DynamicSampling, GroupSample, PromptGDRO, Verify
from pipelines.default import LR, SETUP

pipeline = Pipeline(
    name="prompt_gdro",
    seed=0,
    steps=60,
    **SETUP,
    stages=[
        # --- Replay: 32 prompts, group by multiplicative weights, prompt uniformly in it
        PromptGDRO(batch=32, bins=4, eta=0.1, gamma=0.2),
        # --- Generate: a group of samples per prompt
        GroupSample(n=8, temperature=1.0, max_tokens=8),
        # --- Filter: score with the task's verifier, drop groups with no signal
        Verify(),
        DynamicSampling(),
        # --- Train: group-normalised advantages, clipped policy gradient
        GRPO(lr=LR),
    ],
)
