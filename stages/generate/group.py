"""Group sampling: n independent samples per prompt, the rollout topology of GRPO."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import pyarrow as pa
from pydantic import Field

from gfcr.core.engine import Engine, GenRequest, SamplingParams, SegmentHook, encode_prompt
from gfcr.core.rollout import PLAN_MAX_TOKENS, PLAN_N, NEW_TOKENS, ROLLOUT_SCHEMA, col
from gfcr.core.stage import StageSpec, StepContext
from gfcr.core.registry import register
from stages.generate.rows import (carried, continued, hold_unfinished_groups, plan_samples,
                                  rollout_row, single_turn, stable_id, to_table)

GENERATED = frozenset(ROLLOUT_SCHEMA.names) - {
    col.REWARD, col.REWARDS, col.SCORE_ERROR, col.ADVANTAGE, col.CONSUMED_AT_STEP} | {NEW_TOKENS}
"""Columns a generate stage fills (with ``new_tokens``); scores and advantages come later."""


@register("generate")
class GroupSample(StageSpec):
    """Sample ``n`` completions per prompt (a GRPO group; Shao et al. 2024, DeepSeekMath).

    A Control stage may set a per-prompt ``n`` and ``max_tokens`` in the plan (columns of
    those names); otherwise these fields apply to every prompt. Sampling is seeded from
    (run seed, step), so reruns and resumed runs draw the same samples.

    A plan row with a ``recycle`` column (see :mod:`stages.generate.rows`) is an unfinished
    group brought back by a Replay stage: its samples continue from their stored tokens,
    keep their group id and first policy version, and point to the stored row through
    ``parent_id``; finished samples are carried over without generating. A group with a
    stopped sample is held whole as partial (APRIL), so it is trained with all its samples.

    >>> GroupSample(n=8, max_tokens=16, temperature=1.0)  # doctest: +ELLIPSIS
    GroupSample(name=None, type='group', n=8, ...)
    """

    type: Literal["group"] = "group"
    n: int = Field(8, ge=1)
    """Samples per prompt (the group), unless the plan's ``n`` column says otherwise."""
    temperature: float = Field(1.0, ge=0.0)
    """Sampling temperature; 0 is greedy."""
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    """Nucleus sampling mass; keep 1.0 for training (exact logprob ratios, gfcr.core.engine)."""
    max_tokens: int = Field(16, ge=1)
    """Completion tokens per sample, unless the plan's ``max_tokens`` column says otherwise."""
    stop: tuple[str, ...] = ()
    """A sample ends after it produces any of these strings (besides EOS)."""
    segment_tokens: int = Field(16, ge=1)
    """Tokens decoded between two calls of the Control stages' in-flight hooks."""

    writes: ClassVar[frozenset[str]] = GENERATED
    continues_partials: ClassVar[bool] = True
    """Honours the plan's ``recycle`` column (see :mod:`stages.generate.rows`)."""

    def sampling_temperature(self) -> float:
        """The temperature this stage samples at (a train stage's ratio must match it)."""
        return self.temperature

    def plan_defaults(self) -> dict[str, int]:
        """A plan row without its own ``n`` or ``max_tokens`` gets these."""
        return {PLAN_N: self.n, PLAN_MAX_TOKENS: self.max_tokens}

    def params(self, ctx: StepContext) -> SamplingParams:
        seed = int(ctx.rng(self.label).integers(2**31 - 1))
        return SamplingParams(temperature=self.temperature, top_p=self.top_p,
                              max_tokens=self.max_tokens, stop=self.stop,
                              segment_tokens=self.segment_tokens, seed=seed)

    def generate(self, ctx: StepContext, plan: pa.Table, engine: Engine,
                 on_segment: SegmentHook | None) -> pa.Table:
        prompts = plan.to_pylist()
        samples = [plan_samples(prompt, self.n) for prompt in prompts]
        return to_table(generate_groups(ctx, prompts, samples, engine, self.params(ctx),
                                        on_segment))


def generate_groups(ctx: StepContext, prompts: list[dict[str, Any]],
                    samples: list[list[dict[str, Any]]], engine: Engine,
                    params: SamplingParams, on_segment: SegmentHook | None
                    ) -> list[dict[str, Any]]:
    """Rollout rows of a step's groups, in prompt then sample order.

    ``prompts[i]`` is a plan row (its ``prompt`` is the text the policy sees) and
    ``samples[i]`` its samples as :func:`~stages.generate.rows.plan_samples` gives them: a
    sample with a ``finish_reason`` is carried over unchanged, any other one is generated
    from its ``prefix_ids`` (empty: from scratch); a sample's first ``hint_tokens``
    completion tokens are a forced turn (ConditionedSample's hints). Hooks that count groups (APRIL, ARRoL)
    are told each request's group first (``expect``), and a group with a stopped sample is
    held whole (:func:`~stages.generate.rows.hold_unfinished_groups`).
    """
    requests: list[GenRequest] = []
    slots: list[tuple[int, str, list[int], dict[str, Any], int | None]] = []
    for p_idx, (prompt, group) in enumerate(zip(prompts, samples)):
        ids = encode_prompt(engine, prompt[col.PROMPT])
        group_id = (prompt.get(col.GROUP_ID)
                    or stable_id(ctx.run_id, ctx.step, ctx.round, "group", p_idx))
        for sample in group:
            key = None
            if sample["finish_reason"] is None:  # carried-over samples are not generated
                key = len(requests)
                requests.append(GenRequest(
                    key=key, prompt_ids=ids, prefix_ids=list(sample["prefix_ids"]),
                    prefix_logprobs=list(sample["prefix_logprobs"]),
                    max_tokens=prompt.get("max_tokens")))
            slots.append((p_idx, group_id, ids, sample, key))
    if on_segment is not None:  # hooks that count groups see the layout
        on_segment.expect({k: g for _, g, _, _, k in slots if k is not None})
    outputs = engine.generate(requests, params, on_segment)
    rows = []
    for p_idx, group_id, ids, sample, key in slots:
        if key is None:
            made, completion, logprobs = (carried(sample), sample["prefix_ids"],
                                          sample["prefix_logprobs"])
        else:
            out = outputs[key]
            made, completion, logprobs = continued(out, sample), out.completion_ids, out.logprobs
        traj = single_turn(ids, completion, logprobs, sample.get("hint_tokens") or 0)
        rows.append(rollout_row(ctx, prompts[p_idx], group_id, sample["sample_idx"], traj,
                                made, engine, parent_id=sample["parent_id"],
                                new_tokens=len(completion) - len(sample["prefix_ids"])))
    return hold_unfinished_groups(rows)
