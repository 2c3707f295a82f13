"""D³S: train on each group's max-Var(A) half and the highest |A|·H half of the tokens at
first, relaxing to everything over 40 steps ("Learning More with Less: A Dynamic
Dual-Level Down-Sampling Framework for Efficient Policy Optimization", 2025).

The token level is applied by the trainer from the ``token_keep_ratio`` column, and the
kept rows train on the whole-group advantages D³S chose them on (``d3s_advantage``); see
``stages.filter.d3s``.
"""

from gfcr import Pipeline
from stages import D3S, GRPO, GroupSample, UniformSampler, Verify
from pipelines.default import LR, SETUP

pipeline = Pipeline(
    name="d3s",
    seed=0,
    steps=40,
    **SETUP,
    stages=[
        # --- Replay
        UniformSampler(batch=16),
        # --- Generate
        GroupSample(n=8, temperature=1.0, max_tokens=8),
        # --- Filter: verify, then dual-level down-sampling on a relaxing schedule
        Verify(),
        D3S(keep=0.5, token_keep=0.5, relax_steps=40),
        # --- Train
        GRPO(lr=LR),
    ],
)
