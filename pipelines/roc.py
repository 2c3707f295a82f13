"""GRPO-RoC: over-sample 16 per prompt, keep 8 — the fewest-error correct ones and a
uniform sample of the incorrect ones (Shang et al. 2025, "rStar2-Agent: Agentic
Reasoning Technical Report").

On chain_sum an "error" is a character of the completion outside the answer (format
noise); for agentic tasks pass ``errors="regex:Traceback|Error"`` or your own counter.
The count each correct rollout was ranked by is stored in ``format_errors``.
"""

from gfcr import Pipeline
from stages import (GRPO, DynamicSampling, GroupSample, ResampleOnCorrect, UniformSampler,
                    Verify)
from pipelines.default import LR, SETUP

pipeline = Pipeline(
    name="roc",
    seed=0,
    steps=40,
    **SETUP,
    stages=[
        # --- Replay
        UniformSampler(batch=16),
        # --- Generate: twice the group size
        GroupSample(n=16, temperature=1.0, max_tokens=8),
        # --- Filter: verify, resample on correct down to 8, drop groups with no signal
        Verify(),
        ResampleOnCorrect(group_size=8),
        DynamicSampling(),
        # --- Train
        GRPO(lr=LR),
    ],
)
