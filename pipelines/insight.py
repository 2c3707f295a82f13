"""InSight: pick prompts by weighted mutual information on Beta beliefs.

"Efficient RLVR Training via Weighted Mutual Information Data Selection" (Zhou et al.
2026) on the default task. Each prompt's success rate has a Beta belief from the run's
history in the store (prior centred on the run's pass rate); the 32 prompts with the
highest information gain, weighted by the chance that a group of 8 carries signal, are
drawn each step — before any rollout, so no compute goes to groups known to be flat.
"""

from gfcr import Pipeline
from stages import GRPO, DynamicSampling, GroupSample, InSight, Verify
from pipelines.default import LR, SETUP

pipeline = Pipeline(
    name="insight",
    seed=0,
    steps=60,
    **SETUP,
    stages=[
        # --- Replay: 32 prompts by weighted mutual information (rollouts = GroupSample's n)
        InSight(batch=32, rollouts=8),
        # --- Generate: a group of samples per prompt
        GroupSample(n=8, temperature=1.0, max_tokens=8),
        # --- Filter: score with the task's verifier, drop groups with no signal
        Verify(),
        DynamicSampling(),
        # --- Train: group-normalised advantages, clipped policy gradient
        GRPO(lr=LR),
    ],
)
