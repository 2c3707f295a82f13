"""The operator library: importing it registers every stage and component with gfcr.

One folder per kind (generate, filter, control, replay, train) plus the engines and the
tasks. gfcr finds this package through the ``gfcr.plugins`` entry point; the classes are
re-exported here so a pipeline file can write ``from stages import GroupSample, Verify``.
"""

from stages.control.allocate import RolloutAllocator
from stages.control.budget import TokenBudget
from stages.control.partial import ActivePartialRollouts
from stages.control.prune import OnlinePrune
from stages.control.turns import TurnBudget
from stages.engines.hf import HF
from stages.envs import Feedback, GuessNumber, PythonArithmetic
from stages.engines.vllm import VLLM
from stages.engines.smollm2 import SmolLM2
from stages.engines.tiny import HFCheckpoint, TinyLlama
from stages.filter.d3s import D3S
from stages.filter.dynamic import DynamicSampling
from stages.filter.gigpo import GiGPO
from stages.filter.igpo import IGPO
from stages.filter.overlong import Overlong
from stages.filter.roc import ResampleOnCorrect
from stages.sandbox import Sandbox
from stages.filter.list_order import ListOrder
from stages.filter.verifiers import CodeTests, Function, Match, MathAnswer, TaskScore
from stages.filter.verify import Verify
from stages.generate.agent import AgentEnv
from stages.generate.env_stages import GymEnv, RemoteEnv, TextArenaEnv
from stages.generate.episodes import Episodes
from stages.generate.conditioned import ConditionedSample, Exemplars, Hints
from stages.generate.group import GroupSample
from stages.generate.tree import TreeRollout
from stages.generate.verifiers_env import VerifiersEnv
from stages.replay.cross_run import CrossRunReplay
from stages.replay.dots import DOTS
from stages.replay.fission import FissionBranch
from stages.replay.gdro import PromptGDRO
from stages.replay.insight import InSight
from stages.replay.recycle import RecyclePartials
from stages.replay.rollout_replay import RolloutReplay
from stages.replay.uniform import UniformSampler
from stages.replay.vade import VADE
from stages.tasks.files import FileTask
from stages.tasks.reasoning_gym import JsonlTask, ReasoningGym
from stages.tasks.verifiers import VerifiersTask
from stages.train.grpo import GRPO
from stages.train.lora import LoraSpec
from stages.train.sft import SFT

__all__ = ["FissionBranch", "GiGPO", "IGPO", "TurnBudget",
           "HF", "VLLM", "HFCheckpoint", "TinyLlama", "DynamicSampling", "Verify", "GroupSample",
           "UniformSampler", "FileTask", "JsonlTask", "ReasoningGym", "GRPO", "SFT",
           "D3S", "Overlong", "ResampleOnCorrect", "Sandbox", "CodeTests", "Function", "Match",
           "MathAnswer", "TaskScore", "ConditionedSample", "Exemplars", "Hints", "TreeRollout",
           "ActivePartialRollouts", "OnlinePrune", "RolloutAllocator", "TokenBudget",
           "RecyclePartials", "RolloutReplay", "DOTS", "InSight", "VADE", "PromptGDRO",
           "CrossRunReplay", "SmolLM2", "Episodes", "Feedback", "GuessNumber",
           "PythonArithmetic", "AgentEnv", "LoraSpec", "VerifiersEnv", "VerifiersTask",
           "GymEnv", "RemoteEnv", "TextArenaEnv", "ListOrder"]
