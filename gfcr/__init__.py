"""gfcr: declarative GFCR (Generate, Filter, Control, Replay) rollout pipelines for LLM RL.

The public API. Importing gfcr is cheap: each name below loads its module on first use
(PEP 562), so a command that needs none of them (``gfcr report``, ``gfcr sql``) does not
pay for the pipeline, engine and run modules; torch, prefect and mlflow load only when a
run needs them.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gfcr.core.engine import (Engine, Flight, GenOutput, GenRequest, Inflight, SamplingParams,
                                  Tokenizer)
    from gfcr.core.policy import Policy
    from gfcr.core.environment import Environment, Message, Step, Tool, register_env
    from gfcr.core.loading import load
    from gfcr.core.pipeline import (Checkpointing, Evaluation, LearnerPlacement, Pipeline,
                                    PipelineError)
    from gfcr.core.settings import EvalSet, Sampled
    from gfcr.core.rollout import ROLLOUT_SCHEMA, SchemaError, col, conform, prompt_id
    from gfcr.core.services import Generator, Learner, Scorer, Services, WeightHandle, WeightSync
    from gfcr.core.stage import FilterResult, Spec, StageSpec, StepContext, TrainResult
    from gfcr.core.registry import lookup, register
    from gfcr.launch.hooks import RunSummary
    from gfcr.launch.placement import Placement
    from gfcr.launch.run import execute

_WHERE = {
    "gfcr.core.engine": ("Engine", "Flight", "GenOutput", "GenRequest", "Inflight",
                         "SamplingParams", "Tokenizer"),
    "gfcr.core.policy": ("Policy",),
    "gfcr.core.environment": ("Environment", "Message", "Step", "Tool", "register_env"),
    "gfcr.core.pipeline": ("Checkpointing", "Evaluation", "LearnerPlacement", "Pipeline",
                      "PipelineError"),
    "gfcr.core.settings": ("EvalSet", "Sampled"),
    "gfcr.core.loading": ("load",),
    "gfcr.core.rollout": ("ROLLOUT_SCHEMA", "SchemaError", "col", "conform", "prompt_id"),
    "gfcr.launch.hooks": ("RunSummary",),
    "gfcr.launch.placement": ("Placement",),
    "gfcr.launch.run": ("execute",),
    "gfcr.core.services": ("Generator", "Learner", "Scorer", "Services", "WeightHandle",
                      "WeightSync"),
    "gfcr.core.stage": ("FilterResult", "Spec", "StageSpec", "StepContext", "TrainResult"),
    "gfcr.core.registry": ("lookup", "register"),
}
_MODULE = {name: module for module, names in _WHERE.items() for name in names}

__all__ = [name for names in _WHERE.values() for name in names]


def __getattr__(name: str) -> object:
    """Load a public name's module on first use and keep the name here."""
    module = _MODULE.get(name)
    if module is None:
        raise AttributeError(f"module 'gfcr' has no attribute {name!r}")
    value = getattr(import_module(module), name)  # getattr: the name is data (_MODULE)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
