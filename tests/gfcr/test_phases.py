"""The phase table (gfcr.core.stage.PHASES) drives registration, the execution order and the
narrowing to each phase's protocol."""

from __future__ import annotations

from typing import Literal

import pytest

from gfcr.core.composition import execution_order
from gfcr.core.stage import (AUGMENT, FILTER, PHASES, SELECT, Augment, FilterResult, Select,
                             StageSpec)
from gfcr.core.registry import register
from stages import GRPO, DynamicSampling, GroupSample, UniformSampler, Verify


def test_registration_names_the_phase_a_kind_needs():
    with pytest.raises(TypeError, match=r"lacks \['apply'\]"):
        @register("filter")
        class NoApply(StageSpec):
            type: Literal["_no_apply"] = "_no_apply"

    with pytest.raises(TypeError, match=r"lacks \['select or augment'\]"):
        @register("replay")
        class Neither(StageSpec):
            type: Literal["_neither"] = "_neither"


def test_each_phase_narrows_to_its_protocol_and_kind():
    stages = [UniformSampler(batch=2), GroupSample(), Verify(), DynamicSampling(), GRPO()]
    assert [s.label for s in SELECT.of(stages)] == ["uniform"]
    assert all(isinstance(s, Select) for s in SELECT.of(stages))
    assert AUGMENT.of(stages) == [] and not any(isinstance(s, Augment) for s in stages)
    assert [s.label for s in FILTER.of(stages)] == ["verify", "dynamic_sampling"]
    order = [(phase, s.label) for phase, s in execution_order(stages)]
    assert order == [("select", "uniform"), ("generate", "group"), ("apply", "verify"),
                     ("apply", "dynamic_sampling"), ("learner", "grpo")]
    assert [p.method for p in PHASES][:4] == ["select", "allocate", "on_segment", "generate"]


def test_a_filter_shaped_stage_of_another_kind_is_not_a_filter():
    class Odd(StageSpec):  # has apply, but is not registered as a filter
        type: Literal["_odd"] = "_odd"
        kind = "replay"  # type: ignore[assignment]

        def apply(self, ctx: object, rollouts: object) -> FilterResult:
            raise AssertionError("never called")

    assert FILTER.of([Odd()]) == []
