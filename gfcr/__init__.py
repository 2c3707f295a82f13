"""gfcr: declarative GFCR (Generate, Filter, Control, Replay) rollout pipelines for LLM RL.

The public API. Importing gfcr is cheap: torch, prefect and mlflow load only when a run
needs them.
"""

from gfcr.engine import (Engine, Flight, GenOutput, GenRequest, Inflight, Policy, SamplingParams,
                         Tokenizer)
from gfcr.pipeline import Checkpointing, Evaluation, Pipeline, PipelineError
from gfcr.loading import load
from gfcr.rollout import ROLLOUT_SCHEMA, SchemaError, col, conform, prompt_id
from gfcr.run import RunSummary, execute
from gfcr.stage import (FilterResult, Spec, StageSpec, StepContext, TrainResult, lookup,
                        register)

__all__ = [
    "Engine", "Flight", "GenOutput", "GenRequest", "Inflight", "Policy", "SamplingParams",
    "Tokenizer",
    "Checkpointing", "Evaluation", "Pipeline", "PipelineError", "load",
    "ROLLOUT_SCHEMA", "SchemaError", "col", "conform", "prompt_id",
    "RunSummary", "execute",
    "FilterResult", "Spec", "StageSpec", "StepContext", "TrainResult", "lookup", "register",
]
