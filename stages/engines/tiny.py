"""Policies the HF engine runs: a config-built tiny Llama and any local HF checkpoint.

``tiny_llama`` is the embedded default's policy: a real ``transformers.LlamaForCausalLM``
built from a ``LlamaConfig`` (random weights under a fixed seed, float32) with a
deterministic character tokenizer, so a pipeline runs on a laptop CPU with nothing
downloaded. ``hf_checkpoint`` loads a model and tokenizer from a local directory only.

>>> policy = TinyLlama(hidden_size=32, num_layers=1, num_heads=2).build(seed=0)
>>> policy.tokenizer.decode(policy.tokenizer.encode("1+1="))
'1+1='
"""

from __future__ import annotations

import string
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from gfcr.engine import Policy
from gfcr.stage import Spec, register

PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
_SPECIAL = 3
_CHARS = "".join(c for c in string.printable if c not in "\x0b\x0c")


class CharTokenizer:
    """One id per printable ASCII character, after ``0=pad, 1=bos, 2=eos``.

    Deterministic and file-free, so a tiny policy needs no download and its ids never
    drift between runs. ``encode`` adds no special tokens; ``decode`` drops them.
    """

    pad_token_id: int = PAD_ID
    bos_token_id: int = BOS_ID
    eos_token_id: int = EOS_ID
    vocab_size: int = _SPECIAL + len(_CHARS)

    def __init__(self) -> None:
        self._ids = {c: i + _SPECIAL for i, c in enumerate(_CHARS)}

    def encode(self, text: str) -> list[int]:
        """Ids of ``text``; ValueError names the first character outside the vocabulary."""
        try:
            return [self._ids[c] for c in text]
        except KeyError:
            pos = next(i for i, c in enumerate(text) if c not in self._ids)
            raise ValueError(f"CharTokenizer cannot encode character {text[pos]!r} at "
                             f"position {pos} of {text!r}; it knows printable ASCII only"
                             ) from None

    def decode(self, ids: list[int]) -> str:
        """Text of ``ids``, skipping pad/bos/eos; ValueError on ids outside the vocab."""
        out = []
        for i in ids:
            if i >= _SPECIAL:
                if i >= self.vocab_size:
                    raise ValueError(f"CharTokenizer id {i!r} is outside the vocabulary "
                                     f"(size {self.vocab_size})")
                out.append(_CHARS[i - _SPECIAL])
            elif i < 0:
                raise ValueError(f"CharTokenizer id {i!r} is negative")
        return "".join(out)


@register("policy")
class TinyLlama(Spec):
    """A randomly initialised Llama-architecture policy with the character tokenizer.

    Defaults give about 0.67M parameters: small enough to warm up and train on 2 CPU
    cores in minutes, and a real ``LlamaForCausalLM`` so the engine and the trainer run
    the same code paths as on a real checkpoint.

    >>> TinyLlama(hidden_size=64, num_heads=4).build(seed=0).model.config.hidden_size
    64
    """

    type: Literal["tiny_llama"] = "tiny_llama"
    hidden_size: int = Field(128, ge=1)
    num_layers: int = Field(4, ge=1)
    num_heads: int = Field(4, ge=1)
    intermediate_size: int = Field(256, ge=1)
    max_position: int = Field(256, ge=2)
    tie_embeddings: bool = True

    @model_validator(mode="after")
    def _heads_divide_hidden(self) -> "TinyLlama":
        if self.hidden_size % self.num_heads:
            raise ValueError(f"tiny_llama: num_heads={self.num_heads!r} must divide "
                             f"hidden_size={self.hidden_size!r}")
        if (self.hidden_size // self.num_heads) % 2:
            raise ValueError(f"tiny_llama: head size hidden_size/num_heads = "
                             f"{self.hidden_size // self.num_heads!r} must be even (rotary)")
        return self

    def build(self, *, seed: int) -> Policy:
        """A fresh float32 model, weights drawn under ``torch.manual_seed(seed)``."""
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM

        tok = CharTokenizer()
        config = LlamaConfig(
            vocab_size=tok.vocab_size, hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size, num_hidden_layers=self.num_layers,
            num_attention_heads=self.num_heads, num_key_value_heads=self.num_heads,
            max_position_embeddings=self.max_position, tie_word_embeddings=self.tie_embeddings,
            pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
            eos_token_id=tok.eos_token_id, attn_implementation="sdpa")
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = LlamaForCausalLM(config).to(torch.float32)
        return Policy(model=model, tokenizer=tok)


@register("policy")
class HFCheckpoint(Spec):
    """A causal LM and its tokenizer from a local directory (never downloaded).

    >>> HFCheckpoint(path="/models/qwen2.5-0.5b")  # doctest: +SKIP
    """

    type: Literal["hf_checkpoint"] = "hf_checkpoint"
    path: str
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Weights' dtype; float32 by default because the trainer updates these weights."""

    def build(self, *, seed: int) -> Policy:
        """Load model and tokenizer with ``local_files_only=True``; ``seed`` seeds any
        weights the checkpoint lacks."""
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if not Path(self.path).is_dir():
            raise FileNotFoundError(f"hf_checkpoint: path={self.path!r} is not a directory")
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = AutoModelForCausalLM.from_pretrained(
                self.path, local_files_only=True, dtype=getattr(torch, self.dtype))
        hf_tok = AutoTokenizer.from_pretrained(self.path, local_files_only=True)
        return Policy(model=model, tokenizer=HFTokenizer(hf_tok, model, self.path))


class HFTokenizer:
    """Adapts a transformers tokenizer to :class:`gfcr.engine.Tokenizer`.

    ``encode`` adds no special tokens (prompts are built by the task, which decides on
    BOS or chat templates); ``decode`` skips them. A missing pad id falls back to eos.
    """

    def __init__(self, hf_tokenizer: Any, model: Any = None, where: str = "") -> None:
        self.hf = hf_tokenizer
        eos = hf_tokenizer.eos_token_id
        if eos is None and model is not None:
            eos = getattr(model.config, "eos_token_id", None)
            eos = eos[0] if isinstance(eos, (list, tuple)) and eos else eos
        if not isinstance(eos, int):
            raise ValueError(f"hf_checkpoint: tokenizer at {where!r} has no eos token id "
                             f"(got {eos!r}); generation could never stop on EOS")
        self.eos_token_id: int = eos
        pad = hf_tokenizer.pad_token_id
        self.pad_token_id: int = eos if pad is None else int(pad)

    def encode(self, text: str) -> list[int]:
        return list(self.hf.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int]) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=True)
