"""Cross-run replay (SAPO-style): train on this run's rollouts plus other runs' ones.

"Sharing is Caring: Efficient LM Post-Training with Collective RL Experience Sharing"
(SAPO) with a store as the shared pool: each step adds 4 groups that earlier runs in
the default store (``.gfcr/store``, e.g. ``gfcr run default`` before this) kept and
solved at least once. Replayed rows point at their source rollout (``parent_id``) and
name the store and run they came from in the extra column ``replay_source``. Point
``cross_run_replay.source`` at any other store to share across machines.
"""

from gfcr import Pipeline
from gfcr.core.row_filter import RowFilter
from stages import (GRPO, CrossRunReplay, DynamicSampling, GroupSample, UniformSampler,
                    Verify)
from pipelines.default import LR, SETUP

pipeline = Pipeline(
    name="cross_run",
    seed=0,
    steps=60,
    **SETUP,
    stages=[
        # --- Replay: 32 new prompts; after filtering, 4 groups shared by other runs
        UniformSampler(batch=32),
        CrossRunReplay(source=".gfcr/store", match=RowFilter(kept=True, reward_above=0.0), groups=4),
        # --- Generate: a group of samples per prompt
        GroupSample(n=8, temperature=1.0, max_tokens=8),
        # --- Filter: score with the task's verifier, drop groups with no signal
        Verify(),
        DynamicSampling(),
        # --- Train: GRPO; shared rows are off-policy, corrected by their stored logprobs
        GRPO(lr=LR),
    ],
)
