"""Conditioned generation: difficulty-scheduled hints and in-context exemplar seeding.

Two prompt-side remedies for groups that never succeed (and so carry no GRPO signal):

- **Hints** (ADHint; "ADHint: Adaptive Hints with Difficulty Priors for Reinforcement
  Learning", 2025): some samples of a group start from a prefix of the reference answer
  and continue from there. The hint's length is scheduled by the prompt's difficulty
  under the current policy: ``floor(max_ratio * (1 - p) * len(answer tokens))`` tokens,
  where ``p`` is the prompt's pass-rate estimate from the store (the Beta posterior mean
  of ``History.prompt_stats``; ``default_pass`` when there is no history). Easy prompts
  get no hint, hard ones up to ``max_ratio`` of the answer; ``share`` of each group's
  samples are hinted, the rest are plain samples of the same prompt.
- **Exemplar seeding** (XRPO; "XRPO: Pushing the limits of GRPO with Targeted
  Exploration and Exploitation", 2025): a prompt attempted at least ``after`` times
  without a single success gets ``k`` solved prompts of the same run, each followed by its
  reference answer, prepended to its text.

Marks for the trainer and the store: the extra column ``hint_tokens`` (int32) is the
number of leading completion tokens that were forced (0: none). The trainer must mask
them out of the policy loss (they are the reference's tokens, not the policy's choices);
their ``logprobs`` are nevertheless the policy's teacher-forced logprobs, so an unaware
trainer computes correct ratios. ``exemplars`` (int32) counts the exemplars prepended;
the row's ``prompt``/``prompt_ids`` are the seeded text, its ``prompt_id`` the original's,
so the prompt's history stays one series.

Recycled groups (APRIL's partial rollouts, ``stages.replay.recycle``): a plan row with a
``recycle`` column is continued as :class:`GroupSample` continues it — its stored prompt
text (already seeded) and each sample's stored tokens, hint included, with the stored
``hint_tokens`` and ``exemplars`` — and is neither seeded nor hinted again. A sample
restarted past the staleness bound starts without a hint. Groups are declared to
in-flight hooks and held whole when a sample is stopped, as with ``GroupSample``.

Departures: ADHint's gradient modulation and posterior-based advantages are trainer
matters and not done here; XRPO's exemplars are the model's own verified solutions,
these are the reference answers of prompts the policy has solved (the same text on
answer-only tasks such as the default's).

>>> ConditionedSample(sample=GroupSample(n=8), hints=Hints(max_ratio=0.5))  # doctest: +ELLIPSIS
ConditionedSample(name=None, type='conditioned', sample=GroupSample(...), ...)
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, Literal

import pyarrow as pa
from pydantic import Field

from gfcr.core.engine import Engine, SegmentHook, encode_prompt
from gfcr.core.rollout import EXEMPLARS, HINT_TOKENS, col  # noqa: F401 (tests import them here)
from gfcr.core.stage import Spec, StageSpec, StepContext
from gfcr.core.registry import register
from stages.generate._policy import forced_logprobs
from stages.generate.group import GENERATED, GroupSample, generate_groups
from stages.generate.rows import RECYCLE, plan_samples, to_table



class Hints(Spec):
    """ADHint's difficulty-scheduled hint prefixes."""

    max_ratio: float = Field(0.5, gt=0.0, le=1.0)
    """Share of the reference answer given to the hardest prompts (pass rate 0)."""
    share: float = Field(0.5, gt=0.0, le=1.0)
    """Share of each group's samples that get the hint."""
    default_pass: float = Field(0.5, ge=0.0, le=1.0)
    """Pass-rate estimate of a prompt the store has no history for."""


class Exemplars(Spec):
    """XRPO's in-context seeding of prompts that keep failing."""

    k: int = Field(2, ge=1)
    """Solved training prompts (with their answers) prepended as exemplars."""
    after: int = Field(8, ge=1)
    """Attempts without a success before a prompt is seeded."""
    separator: str = "\n"
    """Text between the exemplars and the prompt."""


@register("generate")
class ConditionedSample(StageSpec):
    """Group sampling (``sample``) with ADHint hints and XRPO exemplar seeding."""

    type: Literal["conditioned"] = "conditioned"
    sample: GroupSample = Field(default_factory=GroupSample)
    """How each group is sampled (a GroupSample config)."""
    hints: Hints | None = Hints()
    """ADHint hint prefixes for hard prompts; None turns them off."""
    exemplars: Exemplars | None = Exemplars()
    """XRPO exemplar seeding of prompts that keep failing; None turns it off."""

    writes: ClassVar[frozenset[str]] = GENERATED | {HINT_TOKENS, EXEMPLARS}
    continues_partials: ClassVar[bool] = True
    engine_needs: ClassVar[frozenset[str]] = frozenset({"continuation", "teacher_forcing"})
    """Honours the plan's ``recycle`` column (see the module note on recycled groups)."""

    def sampling_temperature(self) -> float:
        """The temperature this stage samples at (a train stage's ratio must match it)."""
        return self.sample.temperature

    def generate(self, ctx: StepContext, plan: pa.Table, engine: Engine,
                 on_segment: SegmentHook | None) -> pa.Table:
        prompts = plan.to_pylist()
        fresh = [i for i, p in enumerate(prompts) if p.get(RECYCLE) is None]
        stats = prompt_stats(ctx, [prompts[i][col.PROMPT_ID] for i in fresh])
        seeds = self._seeds(ctx, [prompts[i] for i in fresh], stats)
        samples = [plan_samples(prompt, self.sample.n) for prompt in prompts]
        for at, i in enumerate(fresh):
            text, count = seeds.get(at, ("", 0))
            prompts[i] = dict(prompts[i], **{col.PROMPT: text + prompts[i][col.PROMPT]})
            self._condition(engine, prompts[i], samples[i], stats, count)
        rows = generate_groups(ctx, prompts, samples, engine, self.sample.params(ctx),
                               on_segment)
        exemplars = [s.get(EXEMPLARS) or 0 for group in samples for s in group]  # rows' order
        hints = [sum(len(t["token_ids"]) for t in r[col.TURNS] if t["source"] == "forced")
                 for r in rows]  # the forced turn's length
        table = to_table(rows)
        for name, values in ((HINT_TOKENS, hints), (EXEMPLARS, exemplars)):
            table = table.append_column(pa.field(name, pa.int32()), pa.array(values, pa.int32()))
        return table

    def _condition(self, engine: Engine, prompt: dict[str, Any], group: list[dict[str, Any]],
                   stats: dict[str, dict[str, float]], exemplars: int) -> None:
        """Mark a fresh group's samples with its exemplar count and give the last
        ``share`` of them the prompt's hint as a forced prefix (in place)."""
        ids = encode_prompt(engine, prompt[col.PROMPT])
        hint, hint_lp = self._hint(engine, prompt, ids, stats.get(prompt[col.PROMPT_ID]))
        hinted = round(self.hints.share * len(group)) if hint and self.hints else 0
        for i, sample in enumerate(group):
            sample.update(exemplars=exemplars, hint_tokens=0)
            if i >= len(group) - hinted:
                sample.update(prefix_ids=list(hint), prefix_logprobs=list(hint_lp),
                              hint_tokens=len(hint))

    def _hint(self, engine: Engine, prompt: dict[str, Any], prompt_ids: list[int],
              stats: dict[str, float] | None) -> tuple[list[int], list[float]]:
        """The hint tokens for ``prompt`` and their teacher-forced logprobs."""
        if self.hints is None or prompt.get(col.ANSWER) is None:
            return [], []
        answer = engine.encode(str(prompt[col.ANSWER]))
        passed = self.hints.default_pass if not stats or not stats["attempts"] \
            else stats["posterior_mean"]
        cap = prompt.get("max_tokens") or self.sample.max_tokens
        length = hint_length(len(answer), passed, self.hints.max_ratio, cap)
        if length == 0:
            return [], []
        hint = answer[:length]
        try:
            return hint, forced_logprobs(engine, prompt_ids, hint, self.sample.temperature)
        except TypeError as err:
            raise TypeError(f"stage {self.label!r}: hints need the policy's logprobs: "
                            f"{err}") from None

    def _seeds(self, ctx: StepContext, prompts: list[dict[str, Any]],
               stats: dict[str, dict[str, float]]) -> dict[int, tuple[str, int]]:
        """Prompt index -> (exemplar text to prepend, number of exemplars)."""
        if self.exemplars is None or not stats:
            return {}
        failing = [i for i, p in enumerate(prompts)
                   if (s := stats.get(p[col.PROMPT_ID])) and s["attempts"] >= self.exemplars.after
                   and s["successes"] == 0]
        if not failing:
            return {}
        solved = solved_examples(ctx)
        rng = ctx.rng(f"{self.label}/exemplars")
        out: dict[int, tuple[str, int]] = {}
        for i in failing:
            pool = [s for s in solved if s[0] != prompts[i][col.PROMPT_ID]]
            if not pool:
                continue
            pick = rng.choice(len(pool), size=min(self.exemplars.k, len(pool)), replace=False)
            sep = self.exemplars.separator
            out[i] = ("".join(f"{pool[j][1]}{pool[j][2]}{sep}" for j in pick), len(pick))
        return out


def hint_length(answer_tokens: int, pass_rate: float, max_ratio: float, cap: int) -> int:
    """ADHint's schedule: ``floor(max_ratio * (1 - pass_rate) * answer_tokens)`` tokens,
    leaving at least one token of the completion to the policy."""
    want = math.floor(max_ratio * (1.0 - pass_rate) * answer_tokens + 1e-9)
    return max(0, min(want, answer_tokens - 1 if answer_tokens else 0, cap - 1))


def prompt_stats(ctx: StepContext, prompt_ids: list[str]) -> dict[str, dict[str, float]]:
    """Prompt id -> attempts, successes, posterior_mean from ``ctx.history`` (a
    gfcr.core.storage.History); empty when the run has no history."""
    if ctx.history is None or not prompt_ids:
        return {}
    table = ctx.history.prompt_stats(list(dict.fromkeys(prompt_ids)))
    return {r["prompt_id"]: r for r in
            table.select(["prompt_id", "attempts", "successes", "posterior_mean"]).to_pylist()}


def solved_examples(ctx: StepContext) -> list[tuple[str, str, str]]:
    """(prompt id, prompt, answer) of the task's training prompts the history shows
    solved at least once, in prompt-id order."""
    if ctx.history is None:
        return []
    stats = ctx.history.prompt_stats()
    solved = {r["prompt_id"] for r in stats.select(["prompt_id", "successes"]).to_pylist()
              if r["successes"]}
    pool = ctx.task.train_prompts()
    rows = pool.select([col.PROMPT_ID, col.PROMPT, col.ANSWER]).to_pylist()
    return sorted((r[col.PROMPT_ID], r[col.PROMPT], r[col.ANSWER] or "") for r in rows
                  if r[col.PROMPT_ID] in solved)

