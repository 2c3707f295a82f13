"""The operator library: importing it registers every stage and component with gfcr.

One folder per kind (generate, filter, control, replay, train) plus the engines and the
tasks. gfcr finds this package through the ``gfcr.plugins`` entry point; the classes are
re-exported here so a pipeline file can write ``from stages import GroupSample, Verify``.
"""

from stages.engines.hf import HF
from stages.engines.tiny import HFCheckpoint, TinyLlama
from stages.filter.dynamic import DynamicSampling
from stages.filter.verify import Verify
from stages.generate.group import GroupSample
from stages.replay.uniform import UniformSampler
from stages.tasks.reasoning_gym import JsonlTask, ReasoningGym
from stages.train.grpo import GRPO
from stages.train.sft import SFT

__all__ = ["HF", "HFCheckpoint", "TinyLlama", "DynamicSampling", "Verify", "GroupSample",
           "UniformSampler", "JsonlTask", "ReasoningGym", "GRPO", "SFT"]
