"""The HF engine: logprob convention, continuation, batching, sampling, stops, segments."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from gfcr.core.engine import Engine, FnHook, GenRequest, Inflight, SamplingParams
from gfcr.core.policy import Policy
from stages.engines.hf import HF, HFEngine
from stages.engines.hf_sampling import batch_token_logprobs, token_logprobs
from stages.engines.tiny import CharTokenizer, TinyLlama
from tests.resources.weights import wide

PROMPTS = ["1+1=", "hello world, how are", "x", "The cat sat on the"]
GREEDY = SamplingParams(temperature=0, max_tokens=24)


def _policy(seed: int = 0):
    """A small TinyLlama with weights drawn wider than the default init, so greedy text
    varies from token to token instead of repeating one character."""
    return wide(TinyLlama(hidden_size=64, num_layers=2, num_heads=4,
                          intermediate_size=128).build(seed=seed), seed)


@pytest.fixture(scope="module")
def engine() -> HFEngine:
    return HF(device="cpu").build(_policy(), seed=0)


def _requests(engine: HFEngine, prompts=PROMPTS, **kw) -> list[GenRequest]:
    return [GenRequest(key=i, prompt_ids=engine.encode(p), **kw) for i, p in enumerate(prompts)]


def _ids(outs) -> list[list[int]]:
    return [o.completion_ids for o in outs]


def test_engine_satisfies_protocol(engine):
    assert isinstance(engine, Engine)
    assert engine.decode(engine.encode("a+b")) == "a+b"


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_equal_teacher_forced_pass(engine, temperature):
    reqs = _requests(engine)
    outs = engine.generate(reqs, SamplingParams(temperature=temperature, max_tokens=20, seed=1))
    model = engine.policy.model
    for r, o in zip(reqs, outs):
        expected = token_logprobs(model, r.prompt_ids, o.completion_ids, temperature)
        assert len(o.logprobs) == len(o.completion_ids) > 0
        assert torch.allclose(torch.tensor(o.logprobs), expected, atol=1e-4)
    batched, mask = batch_token_logprobs(model, [r.prompt_ids for r in reqs],
                                         _ids(outs), temperature)
    for i, o in enumerate(outs):
        assert mask[i].sum() == len(o.completion_ids)
        assert torch.allclose(batched[i, :len(o.logprobs)], torch.tensor(o.logprobs), atol=1e-4)


def test_greedy_logprobs_are_untempered_log_softmax(engine):
    reqs = _requests(engine)[:2]
    outs = engine.generate(reqs, GREEDY)
    for r, o in zip(reqs, outs):
        expected = token_logprobs(engine.policy.model, r.prompt_ids, o.completion_ids, 1.0)
        assert torch.allclose(torch.tensor(o.logprobs), expected, atol=1e-4)


def test_teacher_forced_logprobs_are_differentiable(engine):
    model = engine.policy.model
    lp = token_logprobs(model, engine.encode("ab"), engine.encode("cd"), 1.0)
    lp.sum().backward()
    assert model.model.embed_tokens.weight.grad is not None
    model.zero_grad(set_to_none=True)


def test_greedy_continuation_equals_uninterrupted(engine):
    reqs = _requests(engine)
    full = engine.generate(reqs, GREEDY)
    params = GREEDY.model_copy(update={"segment_tokens": 7})
    cut = engine.generate(reqs, params,
                          on_segment=FnHook(lambda views: {v.key: "stop" for v in views}))
    assert {o.finish_reason for o in cut} == {"aborted"}
    assert all(len(o.completion_ids) == 7 for o in cut)
    resumed = engine.generate(
        [GenRequest(key=r.key, prompt_ids=r.prompt_ids, prefix_ids=c.completion_ids,
                    prefix_logprobs=c.logprobs) for r, c in zip(reqs, cut)], GREEDY)
    assert _ids(resumed) == _ids(full)
    for a, b in zip(resumed, full):
        assert a.finish_reason == b.finish_reason
        assert a.logprobs[:7] == cut[a.key].logprobs
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4)


def test_batched_equals_unbatched_under_greedy(engine):
    reqs = _requests(engine)
    together = engine.generate(reqs, GREEDY)
    alone = [engine.generate([r], GREEDY)[0] for r in reqs]
    assert _ids(together) == _ids(alone)
    assert len({len(r.prompt_ids) for r in reqs}) > 1
    for a, b in zip(together, alone):
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4)


def test_waves_equal_one_batch(engine):
    reqs = _requests(engine)
    small = HFEngine(engine.policy, autocast=None, max_batch=3, seed=0)
    assert _ids(small.generate(reqs, GREEDY)) == _ids(engine.generate(reqs, GREEDY))


def test_seeded_sampling_is_reproducible(engine):
    reqs = _requests(engine)
    params = SamplingParams(temperature=1.0, max_tokens=16, seed=7)
    first, second = engine.generate(reqs, params), engine.generate(reqs, params)
    assert _ids(first) == _ids(second)
    assert [o.logprobs for o in first] == [o.logprobs for o in second]
    other = engine.generate(reqs, params.model_copy(update={"seed": 8}))
    assert _ids(other) != _ids(first)


def test_unseeded_sampling_follows_the_build_seed():
    reqs = [GenRequest(key=0, prompt_ids=CharTokenizer().encode("abc"))]
    params = SamplingParams(temperature=1.0, max_tokens=16)
    runs = [HF(device="cpu").build(_policy(), seed=5).generate(reqs, params) for _ in range(2)]
    assert _ids(runs[0]) == _ids(runs[1])


def test_tiny_top_p_gives_the_argmax(engine):
    reqs = _requests(engine)
    greedy = engine.generate(reqs, GREEDY)
    nucleus = engine.generate(reqs, SamplingParams(temperature=1.0, top_p=1e-6,
                                                   max_tokens=24, seed=3))
    assert _ids(nucleus) == _ids(greedy)
    for a, b in zip(nucleus, greedy):  # logprobs are taken before top-p truncation
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5)


def test_eos_ends_with_stop_and_is_kept(engine):
    req = _requests(engine)[1]
    full = engine.generate([req], GREEDY)[0].completion_ids
    at = 5
    eos = full[at]
    tok = CharTokenizer()
    tok.eos_token_id = eos  # pretend this character is EOS
    policy = Policy(model=engine.policy.model, tokenizer=tok)
    out = HFEngine(policy, autocast=None, max_batch=8, seed=0).generate([req], GREEDY)[0]
    assert out.finish_reason == "stop"
    assert out.completion_ids == full[:full.index(eos) + 1]
    assert len(out.logprobs) == len(out.completion_ids)


def test_stop_string_ends_with_stop(engine):
    req = _requests(engine)[0]
    full = engine.generate([req], GREEDY)[0]
    stop = engine.decode(full.completion_ids)[6:8]
    params = GREEDY.model_copy(update={"stop": (stop, "never")})
    out = engine.generate([req], params)[0]
    assert out.finish_reason == "stop"
    assert engine.decode(out.completion_ids).endswith(stop)
    first = next(n for n in range(1, 25) if stop in engine.decode(full.completion_ids[:n]))
    assert out.completion_ids == full.completion_ids[:first]


def test_stop_string_spanning_the_prefix_counts(engine):
    req = _requests(engine)[0]
    full = engine.generate([req], GREEDY)[0]
    if min(full.completion_ids[:6]) < 3:
        pytest.skip("special tokens make characters and tokens disagree")
    text = engine.decode(full.completion_ids)
    stop = text[4:6]
    if stop in text[:5]:
        pytest.skip("stop string occurs earlier in this model's text")
    cont = GenRequest(key=0, prompt_ids=req.prompt_ids, prefix_ids=full.completion_ids[:5],
                      prefix_logprobs=full.logprobs[:5])
    out = engine.generate([cont], GREEDY.model_copy(update={"stop": (stop,)}))[0]
    assert out.finish_reason == "stop" and len(out.completion_ids) == 6


def test_max_tokens_gives_length_and_counts_the_prefix(engine):
    reqs = _requests(engine)
    outs = engine.generate(reqs, SamplingParams(temperature=0, max_tokens=5))
    assert all(o.finish_reason == "length" and len(o.completion_ids) == 5 for o in outs)
    full = engine.generate(reqs[:1], GREEDY)[0]
    cont = GenRequest(key=9, prompt_ids=reqs[0].prompt_ids, prefix_ids=full.completion_ids[:3],
                      prefix_logprobs=full.logprobs[:3], max_tokens=8)
    over = GenRequest(key=10, prompt_ids=reqs[0].prompt_ids, prefix_ids=full.completion_ids[:4],
                      prefix_logprobs=full.logprobs[:4], max_tokens=3)
    a, b = engine.generate([cont, over], GREEDY)
    assert (a.finish_reason, a.completion_ids) == ("length", full.completion_ids[:8])
    assert (b.finish_reason, b.completion_ids) == ("length", full.completion_ids[:4])


def test_segment_hook_sees_inflight_and_its_decisions_end_sequences(engine):
    reqs = _requests(engine)[:3]
    reqs[2] = GenRequest(key=2, prompt_ids=reqs[2].prompt_ids, prefix_ids=[10, 11],
                         prefix_logprobs=[-1.0, -2.0])
    calls: list[list[Inflight]] = []

    def hook(views):
        calls.append(views)
        return {0: "prune", 1: "stop"} if len(calls) == 1 else {}

    params = SamplingParams(temperature=0, max_tokens=14, segment_tokens=4)
    outs = engine.generate(reqs, params, on_segment=FnHook(hook))
    assert [o.finish_reason for o in outs] == ["pruned", "aborted", "length"]
    assert [len(o.completion_ids) for o in outs] == [4, 4, 14]
    # key 2 reaches its cap at new token 12: finished sequences are not shown again
    assert [[v.key for v in c] for c in calls] == [[0, 1, 2], [2]]
    assert [c[-1].new_tokens for c in calls] == [4, 8]
    last = calls[-1][0]
    assert last.completion_ids[:2] == [10, 11] and len(last.completion_ids) == 10
    assert last.logprobs[:2] == [-1.0, -2.0] and len(last.logprobs) == 10
    assert outs[2].completion_ids[:10] == last.completion_ids


@pytest.mark.parametrize("max_tokens,shrinks", [(5, 0), (24, 1)])
def test_finished_rows_leave_the_batch_when_it_pays(engine, monkeypatch, max_tokens, shrinks):
    from stages.engines import hf

    calls = []
    real = hf._Wave._shrink
    monkeypatch.setattr(hf._Wave, "_shrink", lambda self, keep: (calls.append(keep),
                                                                 real(self, keep)))
    reqs = _requests(engine)
    params = SamplingParams(temperature=0, max_tokens=max_tokens, segment_tokens=4)
    plain = engine.generate(reqs, params)
    pruned = engine.generate(reqs, params, on_segment=FnHook(lambda views: {0: "prune"}))
    assert len(calls) == shrinks  # 1 row of 4 left with 1 step to come: kept in
    assert pruned[0].finish_reason == "pruned" and len(pruned[0].completion_ids) == 4
    assert _ids(pruned)[1:] == _ids(plain)[1:]
    for a, b in zip(pruned[1:], plain[1:]):
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4)


def test_segment_hook_rejects_unknown_decision(engine):
    with pytest.raises(ValueError, match="'explode'"):
        engine.generate(_requests(engine)[:1], SamplingParams(temperature=0, segment_tokens=2),
                        on_segment=FnHook(lambda views: {0: "explode"}))


def test_versions_and_seconds(engine):
    outs = engine.generate(_requests(engine), SamplingParams(temperature=0, max_tokens=4))
    assert all(o.version_start == o.version_end == engine.version for o in outs)
    assert all(o.seconds > 0 for o in outs)


def test_update_weights_advances_version_and_loads_state():
    policy, donor = _policy(0), _policy(1)
    engine = HF(device="cpu").build(policy, seed=0)
    reqs = _requests(engine)
    assert engine.version == 0
    assert engine.update_weights() == 1 == engine.version == policy.version
    assert engine.generate(reqs, GREEDY)[0].version_end == 1
    want = _ids(HF(device="cpu").build(donor, seed=0).generate(reqs, GREEDY))
    assert engine.update_weights(donor.model.state_dict()) == 2
    assert _ids(engine.generate(reqs, GREEDY)) == want


def test_train_mode_is_restored(engine):
    model = engine.policy.model
    model.train()
    engine.generate(_requests(engine)[:1], SamplingParams(temperature=0, max_tokens=2))
    assert model.training
    model.eval()
    engine.generate(_requests(engine)[:1], SamplingParams(temperature=0, max_tokens=2))
    assert not model.training


def test_bad_requests_are_named(engine):
    ok = GenRequest(key=3, prompt_ids=[5, 6])
    with pytest.raises(ValueError, match="key 3 appears twice"):
        engine.generate([ok, ok], GREEDY)
    bad = GenRequest(key=4, prompt_ids=[5], prefix_ids=[6, 7], prefix_logprobs=[-1.0])
    with pytest.raises(ValueError, match="key=4"):
        engine.generate([bad], GREEDY)
    with pytest.raises(ValueError, match="key=5"):
        engine.generate([GenRequest(key=5, prompt_ids=[])], GREEDY)
    assert engine.generate([], GREEDY) == []


def test_spec_is_strict():
    with pytest.raises(ValidationError):
        HF(devices="cpu")
    with pytest.raises(ValidationError):
        HF(max_batch=0)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="device='cuda'"):
            HF(device="cuda").build(_policy(), seed=0)


def test_lower_precision_runs_under_autocast():
    policy = _policy()
    engine = HF(device="cpu", dtype="bfloat16").build(policy, seed=0)
    outs = engine.generate(_requests(engine), SamplingParams(temperature=0, max_tokens=6))
    assert all(len(o.completion_ids) == 6 for o in outs)
    assert next(policy.model.parameters()).dtype == torch.float32
