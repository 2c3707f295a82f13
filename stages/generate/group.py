"""Group sampling: n independent samples per prompt, the rollout topology of GRPO."""

from __future__ import annotations

from typing import ClassVar, Literal

import pyarrow as pa
from pydantic import Field

from gfcr.engine import Engine, GenRequest, SamplingParams, SegmentHook
from gfcr.rollout import ROLLOUT_SCHEMA, col
from gfcr.stage import StageSpec, StepContext, register
from stages.generate.rows import rollout_row, stable_id, to_table

GENERATED = frozenset(ROLLOUT_SCHEMA.names) - {
    col.REWARD, col.REWARDS, col.SCORE_ERROR, col.ADVANTAGE, col.CONSUMED_AT_STEP}
"""Columns a generate stage fills; scores and advantages come later."""


@register("generate")
class GroupSample(StageSpec):
    """Sample ``n`` completions per prompt (a GRPO group; Shao et al. 2024, DeepSeekMath).

    A Control stage may set a per-prompt ``n`` and ``max_tokens`` in the plan (columns of
    those names); otherwise these fields apply to every prompt. Sampling is seeded from
    (run seed, step), so reruns and resumed runs draw the same samples.

    >>> GroupSample(n=8, max_tokens=16, temperature=1.0)  # doctest: +ELLIPSIS
    GroupSample(name=None, type='group', n=8, ...)
    """

    type: Literal["group"] = "group"
    n: int = Field(8, ge=1)
    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    max_tokens: int = Field(16, ge=1)
    stop: tuple[str, ...] = ()
    segment_tokens: int = Field(16, ge=1)

    writes: ClassVar[frozenset[str]] = GENERATED

    def params(self, ctx: StepContext) -> SamplingParams:
        seed = int(ctx.rng(self.label).integers(2**31 - 1))
        return SamplingParams(temperature=self.temperature, top_p=self.top_p,
                              max_tokens=self.max_tokens, stop=self.stop,
                              segment_tokens=self.segment_tokens, seed=seed)

    def generate(self, ctx: StepContext, plan: pa.Table, engine: Engine,
                 on_segment: SegmentHook | None) -> pa.Table:
        prompts = plan.to_pylist()
        requests, owners = [], []
        for p_idx, prompt in enumerate(prompts):
            ids = engine.encode(prompt[col.PROMPT])
            for i in range(int(prompt.get("n") or self.n)):
                requests.append(GenRequest(key=len(requests), prompt_ids=ids,
                                           max_tokens=prompt.get("max_tokens")))
                owners.append((p_idx, i))
        outputs = engine.generate(requests, self.params(ctx), on_segment)
        rows = []
        for req, out, (p_idx, i) in zip(requests, outputs, owners):
            group_id = stable_id(ctx.run_id, ctx.step, ctx.round, "group", p_idx)
            rows.append(rollout_row(ctx, prompts[p_idx], group_id, i, req.prompt_ids,
                                    out, engine))
        return to_table(rows)
