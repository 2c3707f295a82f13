"""VerifiersEnv: a verifiers (v1) environment as a generate stage, token-exact.

``VerifiersEnv(module="NAME", args={...}, n=N, max_turns=T, concurrency=C)`` loads the
environment (:mod:`stages.envs._vf`: a taskset package ``NAME``, or a module whose
``load_environment(**args)`` returns a ``vf.Env``) when the stage is built, so a module
that does not exist or a loader that raises fails the pipeline before any step. Each
episode is the environment's own ``Env.run_episode`` (single-turn, multi-turn through its
``Interaction``, tools through its MCP toolsets), its agent's model calls going through
verifiers' interception to gfcr's endpoint, which records the engine's token ids and
logprobs of every turn (it is :class:`~stages.generate.agent.AgentEnv` underneath: the
same waves, rows and limits). The reward is the rubric's weighted sum
(``trace.reward``), each reward function's value a component in ``rewards``. An episode
whose environment, tool or rubric raises, or whose reward is not a finite number, is
recorded in ``score_error`` and the step goes on.

The task's prompts: :class:`stages.tasks.verifiers.VerifiersTask` gives the environment's
own tasks (train and held-out); a row of any other task is made the environment's task
type on the row's prompt (and answer).

>>> VerifiersEnv(module="my_env", n=4)  # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any, Callable, Literal

import pyarrow as pa
from pydantic import Field, PrivateAttr, model_validator

from gfcr.core.engine import Engine, SegmentHook
from gfcr.core.stage import StepContext
from gfcr.core.registry import register
from stages.envs import _vf
from stages.generate.agent import AgentEnv

AGENT = "stages.generate.verifiers_env:VerifiersEnv"
"""What ``agent`` holds: the episodes are the environment's, not a user's function."""


@register("generate")
class VerifiersEnv(AgentEnv):
    """Episodes of a verifiers environment, scored by its rubric (module docstring)."""

    type: Literal["verifiers"] = "verifiers"  # type: ignore[assignment]
    agent: Literal["stages.generate.verifiers_env:VerifiersEnv"] = AGENT  # type: ignore[assignment]
    """Fixed (another value is refused): the episodes are the environment's
    (``module``), not a user's function."""
    module: str
    """The environment: an installed taskset package or a module on the path."""
    args: dict[str, Any] = Field(default_factory=dict)
    """Its arguments: the taskset config's fields, or ``load_environment``'s."""
    max_turns: int = Field(8, ge=1)
    """Most model calls an episode's agent may make (verifiers' ``max_turns``)."""

    _env: Any = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _loads(self) -> "VerifiersEnv":
        self._env = _vf.load(self.module, self.args, self.max_turns)
        return self

    def generate(self, ctx: StepContext, plan: pa.Table, engine: Engine,
                 on_segment: SegmentHook | None) -> pa.Table:
        with _vf.Runner(self._env) as runner:
            self._runner = runner
            try:
                return super().generate(ctx, plan, engine, on_segment)
            finally:
                self._runner = None

    _runner: Any = PrivateAttr(default=None)

    def agent_function(self) -> Callable[..., Any]:
        runner, env, label = self._runner, self._env, self.label
        found = {t.data.idx: t for t in _vf.tasks(env)}
        timeout = self.timeout

        def episode(client: Any, row: dict[str, Any]) -> tuple[float, dict[str, float]]:
            task = _vf.task_for(env, found, row)
            done = runner.episode(task, label, str(client.base_url), timeout)
            return _vf.outcome(done)

        return episode
