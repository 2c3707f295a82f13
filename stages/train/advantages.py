"""The advantage estimators, where the trainer has always imported them from; they live
in :mod:`stages.advantages`, shared by the train and filter stages (D³S ranks on them)."""

from stages.advantages import (ADVANTAGES, EPS, FLAT_ULPS, MAD_EPS, READS_COMPONENTS, AdvantageFn,
                               advantage, drgrpo, gdpo, grpo, known_advantage, lookup_advantage,
                               mc_grpo, median_pivots, reinforce, rloo)
from stages.reward_components import reward_components

__all__ = ["ADVANTAGES", "EPS", "FLAT_ULPS", "MAD_EPS", "READS_COMPONENTS", "AdvantageFn",
           "advantage", "drgrpo", "gdpo", "grpo", "known_advantage", "lookup_advantage",
           "mc_grpo", "median_pivots", "reinforce", "reward_components", "rloo"]
