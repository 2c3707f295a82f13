"""APRIL: active partial rollouts (Zhou et al. 2025, "APRIL: Active Partial Rollouts in
Reinforcement Learning to Tame Long-tail Generation").

Each step asks for 24 groups and trains on the first 16 that complete; the sequences
still running then are stopped, stored as partial rollouts with their policy version,
and continued first in the next step (their finished siblings wait with them, so each
group is trained whole). Groups more than 4 policy versions old are restarted instead.
Nothing is discarded: ``stages.replay.recycle.recycle_counts`` says where every partial
went.
"""

from gfcr import Pipeline
from stages import (GRPO, ActivePartialRollouts, GroupSample, RecyclePartials,
                    UniformSampler, Verify)
from pipelines.default import LR, SETUP

pipeline = Pipeline(
    name="april",
    seed=0,
    steps=40,
    **SETUP,
    stages=[
        # --- Replay: the groups left unfinished last step first, then fresh prompts to 24
        RecyclePartials(max_staleness=4),
        UniformSampler(batch=24),
        # --- Control: stop what still runs once 24 / 1.5 = 16 groups are complete
        ActivePartialRollouts(over_provision=1.5),
        # --- Generate: 8 samples per prompt; the hook looks every 2 tokens
        GroupSample(n=8, temperature=1.0, max_tokens=8, segment_tokens=2),
        # --- Filter and Train: only complete groups get here
        Verify(),
        GRPO(lr=LR),
    ],
)
