"""Whole runs with a LoRA learner (GRPO(lora=...)): held-out accuracy rises over the warm
start, synchronously and with generation one step ahead on the engine's own copy; a run
stopped after a checkpoint and resumed (its base rebuilt from the cached warm start, the
adapter and its optimizer from the checkpoint) ends as the uninterrupted run; engine
workers are refused (they do not load adapters yet)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from gfcr.launch.placement import Placement
from gfcr import execute
from gfcr.checkpoints import checkpoint
from stages import GRPO, SFT, GroupSample, UniformSampler, Verify
from stages.train.lora import LoraSpec
from store import RolloutStore
from tests.conftest import tiny_pipeline
from tests.resources.digits import DigitAnswers


def _pipeline(steps: int, **extra: Any) -> Any:
    """A supervised warm start of 4 steps answers some held-out prompts with four digits
    (the setting of the former engine-worker learning test); LoRA GRPO steps raise it."""
    return tiny_pipeline(
        task=DigitAnswers(), steps=steps, **extra,
        warmstart=SFT(steps=4, batch_size=12, schedule="constant"),
        stages=[UniformSampler(batch=8), GroupSample(n=8, max_tokens=4), Verify(),
                GRPO(lr=1e-2, lora=LoraSpec(r=8, alpha=16.0))]
    ).with_overrides(["evaluation.max_tokens=4", "evaluation.size=16"])


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: Any) -> tuple[Path, Any]:
    root = tmp_path_factory.mktemp("lora")
    return root, execute(_pipeline(4), root=root, executor="local", run_id="l")


def test_a_lora_run_learns_over_its_warm_start(uninterrupted: tuple[Path, Any]) -> None:
    _, summary = uninterrupted
    assert summary.accuracy_warmstart is not None
    assert summary.accuracy_after > summary.accuracy_warmstart, summary


def _adapter(root: Path) -> dict[str, torch.Tensor]:
    found = checkpoint.latest(checkpoint.directory(root, "l"))
    return load_file(found.path / "model.safetensors")


def _rows(root: Path) -> list[dict[str, Any]]:
    with RolloutStore.open(root / "store", read_only=True) as s:
        return s.sql("SELECT step, rollout_id, completion_ids, logprobs, reward, advantage "
                     "FROM rollouts WHERE run_id = 'l' ORDER BY step, rollout_id").to_pylist()


def test_a_stopped_lora_run_resumes_as_the_uninterrupted_run(
        tmp_path: Path, uninterrupted: tuple[Path, Any]) -> None:
    root_a, a = uninterrupted
    execute(_pipeline(2), root=tmp_path, executor="local", run_id="l")
    weights = _adapter(tmp_path)
    assert weights and all(".lora_" in k for k in weights)  # the adapter alone
    second = execute(_pipeline(4), root=tmp_path, executor="local", run_id="l")
    assert second.resumed_from == 1
    mine, theirs = _adapter(tmp_path), _adapter(root_a)
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)
    assert _rows(tmp_path) == _rows(root_a)
    assert second.accuracy_after == a.accuracy_after


def test_a_lora_run_on_a_fleet_is_refused_before_it_generates(tmp_path: Path) -> None:
    from gfcr.transport.fleet import Fleet

    with pytest.raises(ValueError, match="the servers do not load yet"):
        execute(_pipeline(1), root=tmp_path, executor="local",
                placement=Placement(generator=Fleet(urls=("http://127.0.0.1:9",))))


def test_an_async_lora_run_generates_ahead_on_its_own_copy_with_the_adapter(
        tmp_path: Path) -> None:
    """max_staleness=1: the engine holds its own policy and generates on a thread; each
    load copies a frozen copy of the adapter into it (the base it got once, after the
    warm start). The run trains on rows one version old, and learns."""
    summary = execute(_pipeline(4, max_staleness=1), root=tmp_path, executor="local", run_id="l")
    lags = [m["staleness/max"] for m in summary.history]
    assert max(lags) == 1
    assert summary.accuracy_after > summary.accuracy_warmstart, summary


@pytest.mark.parametrize("lora", ["merged", "adapter"])
def test_a_lora_run_exports_merged_or_as_a_peft_adapter(
        tmp_path: Path, uninterrupted: tuple[Path, Any], lora: str) -> None:
    """``gfcr export``'s folder of the LoRA run gives the run's logits in transformers:
    the adapter merged into the weights, or the warm-started base with peft's adapter."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from gfcr.checkpoints.export import export_run
    from gfcr.checkpoints.resume import stored_pipeline
    from stages import lora as peft_lora

    root, _ = uninterrupted
    with RolloutStore.open(root / "store", read_only=True) as s:
        pipeline = stored_pipeline(s, "l")
        step, files = export_run(s, root, "l", tmp_path / lora, lora=lora)
    policy = pipeline.policy.build(seed=pipeline.seed)  # the run's: base, warm start, adapter
    pipeline.warmstart.run(policy, pipeline.task, seed=pipeline.seed, cache_dir=root / "cache")
    adapter, _ = peft_lora.read_file(checkpoint.latest(checkpoint.directory(root, "l")).path
                                     / "model.safetensors")
    peft_lora.apply(policy.model, adapter)
    ids = torch.tensor([[5, 17, 23, 42, 8, 11]])
    model = AutoModelForCausalLM.from_pretrained(tmp_path / lora)
    if lora == "adapter":
        assert {"adapter/adapter_config.json", "adapter/adapter_model.safetensors"} <= set(files)
        model = PeftModel.from_pretrained(model, tmp_path / lora / "adapter")
    else:
        assert not any(f.startswith("adapter") for f in files)
    with torch.no_grad():
        expected, got = policy.model(input_ids=ids).logits, model(input_ids=ids).logits
    assert step == 3 and torch.allclose(got, expected, atol=1e-5)
