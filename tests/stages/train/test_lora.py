"""LoRA through peft on the GRPO learner: only the adapter trains, checkpoints hold the
adapter and its optimizer state and resume exactly, the engines generate with the
adapter, a file sync writes the adapter folder alone."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from gfcr.checkpoints import checkpoint
from gfcr.runner.inprocess import LocalGenerator, LocalLearner
from gfcr.weights.versions import FileSync, WeightStore
from stages import GRPO, HF
from stages.engines.hf_sampling import batch_token_logprobs
from stages.engines.torch_io import TORCH_IO
from stages.train.lora import AdapterHandle, LoraSpec
from tests.stages.train.conftest import TINY, rollouts

LORA = LoraSpec(r=4, alpha=8.0)
REWARDS, GROUPS = [1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0], list("aaaabbbb")


def _live(seed: int = 0, lora: LoraSpec | None = LORA, **grpo):
    policy = TINY.build(seed=seed)
    learner = LocalLearner(policy, GRPO(lr=5e-2, lora=lora, **grpo).learner(policy, seed=seed))
    return policy, learner


def _batch(policy):
    return rollouts(policy, REWARDS, GROUPS, completions=["3", "9", "12", "14"] * 2)


def _split(model):
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return ({k: v for k, v in state.items() if ".lora_" not in k},
            {k: v for k, v in state.items() if ".lora_" in k})


def test_only_the_adapter_trains_and_the_optimizer_holds_only_it() -> None:
    policy, learner = _live()
    batch = _batch(policy)
    learner.update(None, batch)  # injects the adapter (B = 0: nothing moves), trains it
    base, adapter = _split(policy.model)
    assert adapter and all(not p.requires_grad for n, p in policy.model.named_parameters()
                           if ".lora_" not in n)
    result, handle = learner.update(None, batch)
    base_after, adapter_after = _split(policy.model)
    assert result.metrics["grad_norm"] > 0
    assert all(torch.equal(base[k], base_after[k]) for k in base)
    assert any(not torch.equal(adapter[k], adapter_after[k]) for k in adapter)
    stage = learner.learner
    held = [p for group in stage.optimizer.param_groups for p in group["params"]]
    adapter_ids = {id(p) for n, p in policy.model.named_parameters() if ".lora_" in n}
    assert {id(p) for p in held} == adapter_ids
    assert isinstance(handle, AdapterHandle) and handle.version == policy.version == 2
    assert set(handle.state().tensors) == {k.replace(".default.", ".") for k in adapter}


def test_checkpoint_holds_the_adapter_and_its_optimizer_and_resumes_exactly(tmp_path) -> None:
    policy, learner = _live()
    engine = HF(device="cpu").build(policy, seed=0)
    batch = _batch(policy)
    for _ in range(2):
        learner.update(None, batch)
    saved = checkpoint.save(tmp_path, run_id="r", step=1, spec_hash="h", policy=policy,
                            learner=learner, engine=engine, progress={}, keep=2)
    with safe_open(str(saved.path / "model.safetensors"), framework="pt") as f:
        keys = list(f.keys())
    assert keys and all(".lora_" in k for k in keys)
    state = TORCH_IO.load_state(saved.path / "state.pt")["learner"]
    assert "model" not in state and state["reference"] is None
    moments = [s["exp_avg"].shape for s in state["optimizer"]["state"].values()]
    adapter_shapes = [p.shape for n, p in policy.model.named_parameters() if ".lora_" in n]
    assert moments == adapter_shapes

    fresh, fresh_learner = _live(seed=0)  # the same base, rebuilt; no adapter yet
    checkpoint.restore(checkpoint.latest(tmp_path), policy=fresh, learner=fresh_learner,
                       engine=HF(device="cpu").build(fresh, seed=0))
    assert fresh.version == policy.version
    for _ in range(2):
        ran, _ = learner.update(None, batch)
        resumed, _ = fresh_learner.update(None, batch)
        assert ran.metrics["loss"] == resumed.metrics["loss"]
    mine, theirs = policy.model.state_dict(), fresh.model.state_dict()
    assert mine.keys() == theirs.keys()
    assert all(torch.equal(mine[k], theirs[k]) for k in mine)


def test_an_adapter_is_refused_on_another_base(tmp_path) -> None:
    policy, learner = _live()
    learner.update(None, _batch(policy))
    learner.save_weights(tmp_path / "adapter.safetensors")
    other, other_learner = _live(seed=1)  # another base
    with pytest.raises(ValueError, match="trained on other base weights"):
        other_learner.load_weights(tmp_path / "adapter.safetensors", 1)


def _forced(model, prompts, completions):
    with torch.no_grad():
        lp, _ = batch_token_logprobs(model, prompts, completions)
    return [lp[i, :len(c)].tolist() for i, c in enumerate(completions)]


@pytest.mark.parametrize("shared", [True, False])
def test_the_hf_engine_generates_with_the_adapter(shared: bool) -> None:
    """Shared: the engine runs the learner's module (nothing moves); own copy (an
    asynchronous run's): only the adapter's tensors are copied in."""
    from gfcr.core.engine import GenRequest, SamplingParams

    policy, learner = _live()
    own = policy if shared else TINY.build(seed=0)
    generator = LocalGenerator(HF(device="cpu").build(own, seed=0), own, shared=shared)
    batch = _batch(policy)
    for _ in range(3):
        _, handle = learner.update(None, batch)
    generator.load(handle)
    assert generator.version == 3
    engine = generator.engine
    prompts = [engine.encode_prompt(p) for p in ("1 + 2 =", "7 + 7 =")]
    outs = engine.generate([GenRequest(key=i, prompt_ids=p) for i, p in enumerate(prompts)],
                           SamplingParams(temperature=1.0, max_tokens=6, seed=3))
    completions = [o.completion_ids for o in outs]
    want = _forced(policy.model, prompts, completions)  # the learner's adapted model
    got = [o.logprobs for o in outs]
    assert all(abs(a - b) < 1e-5 for w, g in zip(want, got) for a, b in zip(w, g))
    base = TINY.build(seed=0)  # and the adapter matters: the base alone differs
    plain = _forced(base.model, prompts, completions)
    assert max(abs(a - b) for w, p in zip(want, plain) for a, b in zip(w, p)) > 1e-3


def test_file_sync_writes_the_adapter_folder_alone(tmp_path) -> None:
    from peft import LoraConfig

    policy, learner = _live()
    _, handle = learner.update(None, _batch(policy))
    store = WeightStore(tmp_path, TORCH_IO)
    FileSync(store, "r").send(handle)
    found = store.get(1)
    assert found.adapter
    manifest = json.loads((found.path / "manifest.json").read_text())
    assert manifest["files"] == ["adapter_model.safetensors", "adapter_config.json"]
    config = LoraConfig.from_pretrained(str(found.path))  # peft reads it back
    assert config.r == 4 and config.lora_alpha == 8.0
    with safe_open(str(found.path / "adapter_model.safetensors"), framework="pt") as f:
        names = list(f.keys())
    assert all(n.startswith("base_model.model.") and ".lora_" in n for n in names)
    full = sum(t.numel() for t in TINY.build(seed=0).model.state_dict().values())
    assert sum(t.numel() for t in handle.state().tensors.values()) < full / 4


def test_the_kl_reference_is_the_base_with_the_adapter_off() -> None:
    policy, learner = _live(kl_coef=0.1)
    batch = _batch(policy)
    for _ in range(2):
        learner.update(None, batch)
    stage = learner.learner
    assert stage.reference is None  # no frozen copy of the model
    work = stage.prepare(None, batch, stage._advantages(batch, batch.column("reward")
                                                        .to_numpy()))
    base = TINY.build(seed=0)
    want = _forced(base.model, work.prompts, work.completions)
    assert all(abs(a - b) < 1e-5 for w, r in zip(want, work.ref) for a, b in zip(w, r))
