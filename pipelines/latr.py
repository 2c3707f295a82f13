"""LATR: GRPO on tree rollouts instead of independent samples.

Each prompt's group is the leaves of a tree that branches where the policy hesitates
(a runner-up token with probability >= 0.2), looks 2 tokens ahead and prunes branches
that stay within edit distance 0.4 of their sibling (Xing et al. 2025, "Lookahead
Tree-Based Rollouts for Enhanced Trajectory-Level Exploration in RLVR"). The rest is the
default pipeline: chain_sum, a tiny Llama warm-started by SFT, dynamic sampling, GRPO.
Lineage is in the store: ``parent_id`` and ``branch_pos`` of every branch.
"""

from gfcr import Pipeline
from stages import GRPO, DynamicSampling, TreeRollout, UniformSampler, Verify
from pipelines.default import LR, SETUP

pipeline = Pipeline(
    name="latr",
    seed=0,
    steps=40,
    **SETUP,
    stages=[
        # --- Replay: which prompts this step
        UniformSampler(batch=16),
        # --- Generate: a tree per prompt; its 8 leaves are the group
        TreeRollout(n=8, branch_prob=0.2, lookahead=2, min_distance=0.4, max_tokens=8),
        # --- Filter: the task's own verifier, then drop groups with no signal
        Verify(),
        DynamicSampling(),
        # --- Train
        GRPO(lr=LR),
    ],
)
