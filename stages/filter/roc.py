"""Resample-on-Correct (GRPO-RoC; Shang et al. 2025, "rStar2-Agent: Agentic Reasoning
Technical Report", section 3).

With outcome-only rewards, a correct trajectory full of tool errors or format slips is
rewarded like a clean one, and the policy learns that errors are fine. RoC over-samples
the group (generate ``2G`` with ``GroupSample(n=2G)``), then down-samples it to ``G``
asymmetrically: among the correct rollouts it keeps those with the fewest errors, among
the incorrect ones it keeps a uniform random subset, so failure modes stay diverse.

How many of each: the group's pass rate is preserved (``round(G * correct / total)``
correct ones), but a group that has both kinds keeps at least one of each.

Departures: the paper samples correct rollouts with probability decreasing in their
error penalty; this keeps the fewest-error ones deterministically (ties at random). The
error count is pluggable (``errors``): ``"extra_chars"`` (default: characters of the
stripped completion outside the reference answer — format noise on short-answer tasks),
``"regex:<pattern>"`` (matches of the pattern, e.g. ``regex:Traceback|Error``) or
``"module:function"`` taking ``(completion, answer, meta)``. The count is stored in the
extra column ``format_errors``.

>>> ResampleOnCorrect(group_size=4, errors="regex:Traceback")  # doctest: +ELLIPSIS
ResampleOnCorrect(name=None, type='roc', group_size=4, threshold=1.0, errors='regex:Traceback')
"""

from __future__ import annotations

import re
from typing import Any, Callable, ClassVar, Literal

import numpy as np
import pyarrow as pa
from pydantic import Field, field_validator

from gfcr.config.refs import resolve
from gfcr.core.rollout import col
from gfcr.core.stage import FilterResult, StageSpec, StepContext
from gfcr.core.registry import register
from stages.filter._table import scored_groups, set_column

FORMAT_ERRORS = "format_errors"
"""Extra column: the error count RoC ranked correct rollouts by."""

ErrorCount = Callable[[str, Any, Any], float]


@register("filter")
class ResampleOnCorrect(StageSpec):
    """Down-sample each over-sampled group to ``group_size``: fewest-error correct
    rollouts, uniformly chosen incorrect ones."""

    type: Literal["roc"] = "roc"
    group_size: int = Field(..., ge=2)
    """Rollouts kept per group (the generate stage samples more)."""
    threshold: float = 1.0
    """A rollout with ``reward >= threshold`` is correct."""
    errors: str = "extra_chars"
    """Error count of a correct rollout: ``extra_chars``, ``regex:<pattern>`` (matches) or
    ``module:function``."""

    reads: ClassVar[frozenset[str]] = frozenset({col.REWARD, col.GROUP_ID, col.COMPLETION,
                                                 col.ANSWER, col.META})
    writes: ClassVar[frozenset[str]] = frozenset({FORMAT_ERRORS})

    @field_validator("errors")
    @classmethod
    def _known_count(cls, value: str) -> str:
        if value.startswith("regex:"):
            try:
                re.compile(value[len("regex:"):])
            except re.error as err:
                raise ValueError(f"errors {value!r}: not a regular expression: {err}")
        elif value != "extra_chars" and value.count(":") != 1:
            raise ValueError(f"errors must be 'extra_chars', 'regex:<pattern>' or "
                             f"'module:function', got {value!r}")
        return value

    def counter(self) -> ErrorCount:
        if self.errors == "extra_chars":
            return extra_chars
        if self.errors.startswith("regex:"):
            regex = re.compile(self.errors[len("regex:"):])
            return lambda completion, answer, meta: float(len(regex.findall(completion)))
        try:
            return resolve(self.errors, "errors")
        except ValueError as err:
            raise ValueError(f"stage {self.label!r}: {err}") from None

    def apply(self, ctx: StepContext, rollouts: pa.Table) -> FilterResult:
        count = self.counter()
        rows = rollouts.select([col.COMPLETION, col.ANSWER, col.META]).to_pylist()
        errors = np.array([float(count(r[col.COMPLETION], r[col.ANSWER], r[col.META]))
                           for r in rows])
        reward, groups = scored_groups(rollouts)
        reasons: list[str | None] = [None] * rollouts.num_rows
        rng = ctx.rng(self.label)
        for members in groups.values():
            for i, why in roc_drops(np.array(members), reward, errors, self.group_size,
                                    self.threshold, rng).items():
                reasons[i] = why
        table = set_column(rollouts, FORMAT_ERRORS, pa.array(errors, pa.float64()))
        return FilterResult(table, keep=[r is None for r in reasons], reason=reasons)


def roc_drops(members: np.ndarray, reward: np.ndarray, errors: np.ndarray, size: int,
              threshold: float, rng: np.random.Generator) -> dict[int, str]:
    """Row -> drop reason for one group's rows ``members`` (indices into the arrays)."""
    if len(members) <= size:
        return {}
    correct = members[reward[members] >= threshold]
    wrong = members[reward[members] < threshold]
    k_pos = int(round(size * len(correct) / len(members)))
    if len(correct) and len(wrong):
        k_pos = min(max(k_pos, 1), size - 1)
    k_pos = min(k_pos, len(correct))
    k_pos = max(k_pos, size - len(wrong))
    order = np.lexsort((rng.random(len(correct)), errors[correct]))  # fewest errors first
    drops = {int(i): "roc: correct, more errors" for i in correct[order[k_pos:]]}
    chosen = set(rng.choice(len(wrong), size=size - k_pos, replace=False).tolist())
    drops.update({int(i): "roc: incorrect, down-sampled"
                  for j, i in enumerate(wrong) if j not in chosen})
    return drops


def extra_chars(completion: str, answer: Any, meta: Any) -> float:
    """Non-space characters of the completion outside the first occurrence of the answer
    (all of them when the answer does not occur)."""
    text = completion.strip()
    ref = "" if answer is None else str(answer).strip()
    if ref and ref in text:
        text = text.replace(ref, "", 1)
    return float(sum(not c.isspace() for c in text))
