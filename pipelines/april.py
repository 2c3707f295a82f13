"""APRIL: active partial rollouts (Zhou et al. 2025, "APRIL: Active Partial Rollouts in
Reinforcement Learning to Tame Long-tail Generation").

Each step asks for 24 groups and trains on the first 16 that complete; the sequences
still running then are stopped, stored as partial rollouts with their policy version,
and continued first in the next step (their finished siblings wait with them, so each
group is trained whole). Groups more than 4 policy versions old are restarted instead.
Nothing is discarded: ``stages.replay.recycle.recycle_counts`` says where every partial
went.
"""

from gfcr import Evaluation, Pipeline
from stages import (GRPO, HF, SFT, ActivePartialRollouts, GroupSample, ReasoningGym,
                    RecyclePartials, TinyLlama, UniformSampler, Verify)

pipeline = Pipeline(
    name="april",
    seed=0,
    steps=40,
    task=ReasoningGym(dataset="chain_sum",
                      config={"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2}),
    policy=TinyLlama(),
    engine=HF(device="cpu"),
    warmstart=SFT(),
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
        GRPO(),
    ],
    evaluation=Evaluation(size=256, max_tokens=8),
)
