"""A checkpoint's policy as a folder any transformers user loads.

:func:`export` writes ``model.safetensors`` and ``config.json`` (``save_pretrained``),
``generation_config.json`` (the eos and pad ids generation stops on) and, for a policy
whose tokenizer is a transformers one (``hf_checkpoint``, ``smollm2``), the tokenizer files
with its chat template. ``AutoModelForCausalLM.from_pretrained(DIR)`` then gives the
run's logits. A ``tiny_llama`` policy's file-free byte or character tokenizer
(stages.engines.tokenizers) has no transformers form: its folder holds the model only,
and ``gfcr_tokenizer.json`` names which tokenizer encodes its prompts.

A LoRA checkpoint (an adapter over the frozen base, stages.train.lora) is exported
``merged`` (the update ``(alpha / r) * B @ A`` added into each adapted weight, plain
model out) or as an ``adapter``: the base model in the folder and peft's adapter
(``adapter/``: ``adapter_config.json``, ``adapter_model.safetensors``), loaded with
``PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(DIR), DIR/adapter)``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Literal, Protocol, runtime_checkable

import torch

from gfcr.core.engine import stop_token_ids
from gfcr.core.policy import Policy
from stages import lora as peft_lora
from stages.engines.torch_io import TORCH_IO

LoraExport = Literal["merged", "adapter"]


@runtime_checkable
class SavesPretrained(Protocol):
    """A tokenizer with a transformers form (stages.engines.tiny.HFTokenizer)."""

    def save_pretrained(self, folder: str) -> Any: ...


def export_policy(policy: Policy, weights: Path, out: Path, *, lora: str,
                  base: Callable[[Policy], None]) -> list[str]:
    """:func:`export` for a policy component's ``export`` method
    (gfcr.core.capabilities.ExportsModel), whose ``lora`` is any text: ``adapter`` keeps
    the adapter, anything else merges it."""
    return export(policy, weights, out, lora="adapter" if lora == "adapter" else "merged",
                  base=base)


def export(policy: Policy, weights: Path, out: Path, *, lora: LoraExport,
           base: Callable[[Policy], None]) -> list[str]:
    """Write ``policy`` with the checkpoint ``weights`` (whole weights or a LoRA adapter)
    to ``out``; returns the files written. ``base(policy)`` rebuilds the base an adapter
    was trained on (the warm start, from its cache) before the adapter is applied."""
    out.mkdir(parents=True, exist_ok=True)
    model = policy.model
    adapter = None
    if peft_lora.is_adapter_file(weights):
        base(policy)
        adapter, _ = peft_lora.read_file(weights)
    else:
        TORCH_IO.load_weights(model, weights)
    if adapter is not None and lora == "adapter":
        _write_adapter(adapter, out / "adapter")
    elif adapter is not None:
        peft_lora.apply(model, adapter)
        model = _merged(model)
    model = model.to("cpu")
    _generation_ids(model, policy)
    model.save_pretrained(out, safe_serialization=True)
    _save_tokenizer(policy, out)
    return sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())


def _merged(model: Any) -> Any:
    """``model`` with every LoRA layer merged into its base layer and replaced by it."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    layers = [(name, m) for name, m in model.named_modules() if isinstance(m, BaseTunerLayer)]
    for name, layer in layers:
        with torch.no_grad():
            layer.merge()
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, layer.get_base_layer())
    return model


def _write_adapter(adapter: peft_lora.AdapterState, folder: Path) -> None:
    """peft's adapter folder: its full ``LoraConfig`` and the tensors under peft's names."""
    peft_lora.write_file(adapter, _mkdir(folder) / peft_lora.ADAPTER_FILE)
    peft_lora.lora_config(adapter.config).save_pretrained(str(folder))


def _mkdir(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _generation_ids(model: Any, policy: Policy) -> None:
    """The generation config stops where the run's engine stopped: eos (with a chat
    model's end of turn) and pad."""
    first = policy.tokenizer.eos_token_id
    eos = [first, *sorted(stop_token_ids(policy.tokenizer) - {first})]
    model.generation_config.eos_token_id = eos[0] if len(eos) == 1 else eos
    model.generation_config.pad_token_id = policy.tokenizer.pad_token_id


def _save_tokenizer(policy: Policy, out: Path) -> None:
    """The transformers tokenizer (and chat template), or a note naming a file-free one."""
    tok = policy.tokenizer
    if isinstance(tok, SavesPretrained):
        tok.save_pretrained(str(out))
        return
    (out / "gfcr_tokenizer.json").write_text(json.dumps({
        "tokenizer": type(tok).__name__,
        "note": "a gfcr file-free tokenizer (stages.engines.tokenizers): encode prompts "
                "with it; transformers has no form of it"}, indent=2))
