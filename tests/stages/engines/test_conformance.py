"""The engine contract, once, for every engine: HF, vLLM (CPU build) and the scripted test
engine. Each test takes an engine case (engine + a temperature it samples at + a weight
state that changes its outputs) and checks one clause of :mod:`gfcr.core.engine`."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from gfcr.core.engine import (Engine, FnHook, GenOutput, GenRequest, Inflight, SamplingParams)
from stages import HF
from stages.engines.hf_sampling import token_logprobs
from tests.resources.scripted import ScriptedEngine
from tests.resources.vllm import VLLM_POLICY, vllm_engine_spec
from tests.resources.weights import wide

PROMPTS = ["1+1=", "hello world, how are", "x", "The cat sat on the"]
SCRIPT = {"1+1=": {"2": 0.6, "3": 0.4}, "1+1=2": {" ": 0.9, "<eos>": 0.1},
          "1+1=2 ": {"o": 0.7, "k": 0.3}, "1+1=2 o": {"k": 1.0},
          "x": {"y": 0.5, "z": 0.5}, "xy": {"z": 0.8, "<eos>": 0.2}, "xyz": {"!": 1.0},
          "xyz!": {"!": 1.0}, "xyz!!": {"!": 1.0}, "xyz!!!": {"?": 1.0}}
OTHER_SCRIPT = {"1+1=": {"3": 1.0}, "x": {"q": 1.0}}


@dataclass
class Case:
    name: str
    engine: Any
    temperature: float
    """A temperature the engine samples at (the scripted engine is greedy at T=1)."""
    donor: Any
    """A weight state for ``update_weights`` that changes what the engine generates."""


def _build(name: str) -> Case:
    if name == "scripted":
        return Case(name, ScriptedEngine(copy.deepcopy(SCRIPT)), 1.0, OTHER_SCRIPT)
    donor = wide(VLLM_POLICY.build(seed=1), seed=1).model.state_dict()
    policy = wide(VLLM_POLICY.build(seed=0), seed=0)
    spec = HF(device="cpu") if name == "hf" else vllm_engine_spec()
    return Case(name, spec.build(policy, seed=0), 0.7, copy.deepcopy(donor))


@pytest.fixture(scope="module", params=["hf", "vllm", "scripted"])
def case(request: pytest.FixtureRequest) -> Case:
    return _build(request.param)


def _requests(engine: Any, prompts: list[str] = PROMPTS, **kw: Any) -> list[GenRequest]:
    return [GenRequest(key=i, prompt_ids=engine.encode(p), **kw) for i, p in enumerate(prompts)]


def _ids(outs: list[GenOutput]) -> list[list[int]]:
    return [o.completion_ids for o in outs]


def _greedy(max_tokens: int = 12, **kw: Any) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=max_tokens, **kw)


def test_satisfies_the_protocol(case: Case) -> None:
    assert isinstance(case.engine, Engine)
    assert case.engine.decode(case.engine.encode("1+1=")) == "1+1="


def test_logprobs_equal_a_teacher_forced_pass(case: Case) -> None:
    engine = case.engine
    reqs = _requests(engine)
    outs = engine.generate(reqs, SamplingParams(temperature=case.temperature, max_tokens=10,
                                                seed=1))
    for r, o in zip(reqs, outs):
        assert len(o.logprobs) == len(o.completion_ids) > 0
        want = token_logprobs(engine.policy.model, r.prompt_ids, o.completion_ids,
                              case.temperature)
        assert torch.allclose(torch.tensor(o.logprobs), want.float(), atol=1e-4), case.name


def test_greedy_continuation_equals_uninterrupted_generation(case: Case) -> None:
    engine = case.engine
    reqs = _requests(engine)
    full = engine.generate(reqs, _greedy())
    cut = engine.generate(reqs, _greedy(segment_tokens=3),
                          FnHook(lambda views: {v.key: "stop" for v in views}))
    assert all(o.finish_reason in ("aborted", "stop") for o in cut)
    resumed = engine.generate(
        [GenRequest(key=r.key, prompt_ids=r.prompt_ids, prefix_ids=o.completion_ids,
                    prefix_logprobs=o.logprobs)
         for r, o in zip(reqs, cut) if o.finish_reason == "aborted"], _greedy())
    by_key = {o.key: o for o in resumed}
    for r, f, c in zip(reqs, full, cut):
        got = by_key[r.key] if c.finish_reason == "aborted" else c
        assert got.completion_ids == f.completion_ids
        assert torch.allclose(torch.tensor(got.logprobs), torch.tensor(f.logprobs), atol=1e-4)


def _forced_log_probs(model: Any, prompt: list[int], completion: list[int],
                      temperature: float) -> torch.Tensor:
    """Teacher-forced ``log_softmax(logits / T)`` over the vocabulary, one row per token."""
    from stages.logprobs import completion_logits

    with torch.inference_mode():
        logits, _, _ = completion_logits(model, [prompt], [completion], temperature)
    return torch.log_softmax(logits[0, :len(completion)].float(), -1)


def test_top_k_logprobs_equal_a_teacher_forced_pass(case: Case) -> None:
    engine, k = case.engine, 3
    reqs = _requests(engine)
    params = SamplingParams(temperature=case.temperature, max_tokens=8, seed=2,
                            segment_tokens=3, top_logprobs=k)
    outs = engine.generate(reqs, params, FnHook(lambda views: {}))
    cont = engine.generate([GenRequest(key=9, prompt_ids=reqs[0].prompt_ids,
                                       prefix_ids=outs[0].completion_ids[:2],
                                       prefix_logprobs=outs[0].logprobs[:2])], params)[0]
    assert cont.top_logprobs[:2] == [[], []]  # none for the prefix it came with
    for r, o in [*zip(reqs, outs), (reqs[0], cont)]:
        assert len(o.top_logprobs) == len(o.completion_ids)
        start = len(o.completion_ids) - len([t for t in o.top_logprobs if t])
        want = _forced_log_probs(engine.policy.model, r.prompt_ids, o.completion_ids,
                                 case.temperature)
        for j in range(start, len(o.completion_ids)):
            got, best = o.top_logprobs[j], want[j].topk(k).values
            assert 0 < len(got) <= k and (len(got) == k or best[len(got)] < -100)
            assert [lp for _, lp in got] == sorted((lp for _, lp in got), reverse=True)
            assert torch.allclose(torch.tensor([lp for _, lp in got]), best[:len(got)],
                                  atol=1e-4), case.name
            assert torch.allclose(torch.tensor([lp for _, lp in got]),
                                  want[j, [t for t, _ in got]], atol=1e-4), case.name
    plain = engine.generate(reqs, params.model_copy(update={"top_logprobs": 0}), FnHook(
        lambda views: {}))
    assert _ids(plain) == _ids(outs) and all(o.top_logprobs == [] for o in plain)


class _Recorder:
    """A segment hook that stops key 0, prunes key 1 and records what it is told."""

    def __init__(self) -> None:
        self.waves: list[list[int]] = []
        self.seen: list[list[int]] = []

    def __call__(self, inflight: list[Inflight]) -> dict[int, Any]:
        self.seen.append([v.key for v in inflight])
        assert all(len(v.completion_ids) == len(v.logprobs) for v in inflight)
        return {0: "stop", 1: "prune"}

    def wave(self, keys: list[int]) -> None:
        self.waves.append(list(keys))

    def expect(self, groups: dict[int, str]) -> None:
        pass


def test_segments_stop_prune_and_announce_waves(case: Case) -> None:
    engine = case.engine
    reqs = _requests(engine, ["1+1=", "x", "hello world, how are"])
    hook = _Recorder()
    outs = engine.generate(reqs, _greedy(max_tokens=8, segment_tokens=2), hook)
    announced = [k for wave in hook.waves for k in wave]
    assert sorted(announced) == [0, 1, 2]  # every request announced exactly once
    first_seen = set(hook.seen[0])
    assert first_seen <= set(hook.waves[0])  # nothing in flight before its wave
    ends = {o.key: o for o in outs}
    if 0 in first_seen:
        assert ends[0].finish_reason == "aborted" and len(ends[0].completion_ids) == 2
    if 1 in first_seen:
        assert ends[1].finish_reason == "pruned"
    assert ends[2].finish_reason in ("stop", "length")


def test_max_tokens_stop_strings_and_eos(case: Case) -> None:
    engine = case.engine
    reqs = _requests(engine)
    full = engine.generate(reqs, _greedy(max_tokens=6))
    for o in full:
        assert len(o.completion_ids) <= 6
        assert o.finish_reason == "stop" or len(o.completion_ids) == 6
    capped = engine.generate([GenRequest(key=0, prompt_ids=reqs[0].prompt_ids, max_tokens=3)],
                             _greedy(max_tokens=6))[0]
    assert capped.completion_ids == full[0].completion_ids[:3]
    longest = max(full, key=lambda o: len(engine.decode(o.completion_ids)))
    text = engine.decode(longest.completion_ids)
    stop = text[1:3] if len(text) >= 3 else text[-1]
    req = reqs[longest.key]
    out = engine.generate([req], _greedy(max_tokens=6, stop=(stop,)))[0]
    assert out.finish_reason == "stop" and engine.decode(out.completion_ids).endswith(stop)
    assert out.completion_ids == longest.completion_ids[:len(out.completion_ids)]
    tokenizer = engine.policy.tokenizer
    eos, tokenizer.eos_token_id = tokenizer.eos_token_id, longest.completion_ids[1]
    try:  # the second token generated becomes EOS: generation ends on it
        out = engine.generate([req], _greedy(max_tokens=6))[0]
    finally:
        tokenizer.eos_token_id = eos
    assert out.finish_reason == "stop"
    assert out.completion_ids == longest.completion_ids[:len(out.completion_ids)]
    assert out.completion_ids[-1] == longest.completion_ids[1]


def test_a_seeded_sampling_run_is_reproduced_exactly(case: Case) -> None:
    engine = case.engine
    reqs = _requests(engine)
    params = SamplingParams(temperature=case.temperature, max_tokens=10, seed=7)
    first, second = engine.generate(reqs, params), engine.generate(reqs, params)
    assert _ids(first) == _ids(second)
    assert [o.logprobs for o in first] == [o.logprobs for o in second]
    hook = FnHook(lambda views: {})  # segments do not change a seeded run's draws
    assert _ids(engine.generate(reqs, params.model_copy(update={"segment_tokens": 4}),
                                hook)) == _ids(engine.generate(
                                    reqs, params.model_copy(update={"segment_tokens": 4}), hook))


def test_an_update_is_used_by_the_next_generation_and_advances_the_version(case: Case) -> None:
    engine = case.engine
    reqs = _requests(engine)
    before = engine.generate(reqs, _greedy())
    original = copy.deepcopy(_state(engine))
    version = engine.version
    assert engine.update_weights(case.donor) == version + 1 == engine.version
    after = engine.generate(reqs, _greedy())
    assert after[0].version_start == after[0].version_end == version + 1
    assert _ids(after) != _ids(before)
    for r, o in zip(reqs, after):  # the new weights, not a stale prefix cache
        want = token_logprobs(engine.policy.model, r.prompt_ids, o.completion_ids, 0.0)
        assert torch.allclose(torch.tensor(o.logprobs), want.float(), atol=1e-4)
    engine.update_weights(original)
    assert _ids(engine.generate(reqs, _greedy())) == _ids(before)


def _state(engine: Any) -> Any:
    if isinstance(engine, ScriptedEngine):
        return engine.script
    return engine.policy.model.state_dict()


def test_a_pipeline_needing_a_capability_its_engine_lacks_is_refused_naming_both() -> None:
    from typing import ClassVar, Literal

    from gfcr.core.loading import load
    from gfcr.core.pipeline import PipelineError
    from gfcr.core.stage import Spec
    from gfcr.core.registry import register

    @register("engine")
    class OneShot(Spec):  # an engine that cannot segment, continue or teacher-force
        type: Literal["one_shot_test"] = "one_shot_test"
        capabilities: ClassVar[frozenset[str]] = frozenset()

        def build(self, policy: Any, *, seed: int) -> Any:
            raise NotImplementedError

    load("default").with_overrides(["engine=one_shot_test"])  # needs nothing: accepted
    with pytest.raises(PipelineError) as err:
        load("april").with_overrides(["engine=one_shot_test"])
    text = str(err.value)
    assert "needs the engine capability segments" in text
    assert "'recycle_partials' needs the engine capability continuation" in text
    assert "'one_shot_test'" in text
    with pytest.raises(PipelineError, match="continuation, segments, top_k"):
        load("latr").with_overrides(["engine=one_shot_test"])
