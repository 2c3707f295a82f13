"""Policies the HF engine runs: a config-built tiny Llama and any local HF checkpoint.

``tiny_llama`` is the embedded default's policy: a real ``transformers.LlamaForCausalLM``
built from a ``LlamaConfig`` (random weights under a fixed seed, float32) with a file-free
byte or character tokenizer (:mod:`stages.engines.tokenizers`), so a pipeline runs on a
laptop CPU with nothing downloaded. ``hf_checkpoint`` loads a model and tokenizer from a
local directory or a hub id (:mod:`stages.engines.hub`).

>>> policy = TinyLlama(hidden_size=32, num_layers=1, num_heads=2).build(seed=0)
>>> policy.tokenizer.decode(policy.tokenizer.encode("1+1="))
'1+1='
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Callable, Literal

from pydantic import Field, model_validator

from gfcr.chat.specials import template_ids
from gfcr.core.policy import Policy
from gfcr.core.stage import Spec
from gfcr.core.registry import register
from stages.engines.export import export_policy
from stages.engines.hub import local_folder
from stages.engines.tokenizers import TOKENIZERS, ByteTokenizer, CharTokenizer
from stages.engines.torch_io import TORCH_IO

__all__ = ["ByteTokenizer", "CharTokenizer", "HFCheckpoint", "HFTokenizer", "TinyLlama"]


_SDPA: dict[str, Any] = {"attn_implementation": "sdpa"}
"""LlamaConfig takes it through **kwargs, which its typed signature does not list."""


@register("policy")
class TinyLlama(Spec):
    """A randomly initialised Llama-architecture policy with a file-free tokenizer.

    Defaults give about 0.67M parameters: small enough to warm up and train on 2 CPU
    cores in minutes, and a real ``LlamaForCausalLM`` so the engine and the trainer run
    the same code paths as on a real checkpoint.

    >>> TinyLlama(hidden_size=64, num_heads=4).build(seed=0).model.config.hidden_size
    64
    """

    type: Literal["tiny_llama"] = "tiny_llama"
    hidden_size: int = Field(128, ge=1)
    """Width of the model (embedding and residual stream)."""
    num_layers: int = Field(4, ge=1)
    """Transformer layers."""
    num_heads: int = Field(4, ge=1)
    """Attention heads (must divide hidden_size; head size even)."""
    intermediate_size: int = Field(256, ge=1)
    """Width of each MLP's hidden layer."""
    max_position: int = Field(256, ge=2)
    """``max_position_embeddings`` of the Llama config (rotary positions)."""
    tie_embeddings: bool = True
    """Share the input embedding and output projection weights (fewer parameters)."""
    tokenizer: Literal["byte", "char"] = "byte"
    """``byte``: UTF-8 bytes, any text (259 ids); ``char``: printable ASCII only (101 ids),
    refused at the start of a run whose task holds other characters."""

    @model_validator(mode="after")
    def _heads_divide_hidden(self) -> "TinyLlama":
        if self.hidden_size % self.num_heads:
            raise ValueError(f"tiny_llama: num_heads={self.num_heads!r} must divide "
                             f"hidden_size={self.hidden_size!r}")
        if (self.hidden_size // self.num_heads) % 2:
            raise ValueError(f"tiny_llama: head size hidden_size/num_heads = "
                             f"{self.hidden_size // self.num_heads!r} must be even (rotary)")
        return self

    def decoder(self) -> Callable[[Sequence[int]], str] | None:
        """Its file-free tokenizer's ``decode`` (gfcr.core.capabilities.DecodesTokens)."""
        tokenizer = TOKENIZERS[self.tokenizer]()
        return lambda ids: str(tokenizer.decode(list(ids)))

    def build(self, *, seed: int) -> Policy:
        """A fresh float32 model, weights drawn under ``torch.manual_seed(seed)``."""
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM

        tok = TOKENIZERS[self.tokenizer]()
        config = LlamaConfig(
            vocab_size=tok.vocab_size, hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size, num_hidden_layers=self.num_layers,
            num_attention_heads=self.num_heads, num_key_value_heads=self.num_heads,
            max_position_embeddings=self.max_position, tie_word_embeddings=self.tie_embeddings,
            pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
            eos_token_id=tok.eos_token_id, **_SDPA)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = LlamaForCausalLM(config).float()
        return Policy(model=model, tokenizer=tok, io=TORCH_IO, remedy=(
            "set policy.tokenizer='byte' (TinyLlama(tokenizer='byte'), or --set "
            "policy.tokenizer=byte), which encodes any text" if self.tokenizer == "char" else ""))

    def export(self, policy: Policy, weights: Path, out: Path, *, lora: str,
               base: Callable[[Policy], None]) -> list[str]:
        """A checkpoint of this policy as a transformers folder (stages.engines.export)."""
        return export_policy(policy, weights, out, lora=lora, base=base)


@register("policy")
class HFCheckpoint(Spec):
    """A causal LM and its tokenizer from a local directory or a hub id.

    A hub id (``org/name``) is resolved through ``huggingface_hub``: the user's cache
    first, downloaded only when it misses and the hub is not offline
    (:mod:`stages.engines.hub`).

    >>> HFCheckpoint(path="/models/qwen2.5-0.5b")  # doctest: +SKIP
    >>> HFCheckpoint(path="Qwen/Qwen2.5-0.5B-Instruct", revision="main")  # doctest: +SKIP
    """

    type: Literal["hf_checkpoint"] = "hf_checkpoint"
    path: str
    """Local directory of a transformers checkpoint (model and tokenizer), or a hub id."""
    revision: str | None = None
    """A hub id's branch, tag or commit (None: ``main``); refused with a local folder."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Weights' dtype; float32 by default because the trainer updates these weights."""
    chat: bool | None = None
    """Pass each task prompt as a user message through the tokenizer's chat template
    (generation prompt added); None: when the tokenizer has a template."""
    system: str | None = None
    """The system message of the chat template; None: the template's own default."""

    def decoder(self) -> Callable[[Sequence[int]], str] | None:
        """The checkpoint's tokenizer's ``decode`` (special tokens shown: a chat template's
        turn markers are part of what the policy saw), or None without its files here."""
        return _hf_decoder(self.path)

    def build(self, *, seed: int) -> Policy:
        """Load model and tokenizer from the folder (a hub id's snapshot) with
        ``local_files_only=True``; ``seed`` seeds any weights the checkpoint lacks."""
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        folder = str(local_folder(self.path, self.revision))
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = AutoModelForCausalLM.from_pretrained(
                # getattr: a torch dtype by its config name
                folder, local_files_only=True, dtype=getattr(torch, self.dtype))
        hf_tok = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        chat = bool(hf_tok.chat_template) if self.chat is None else self.chat
        if chat and not hf_tok.chat_template:
            raise ValueError(f"hf_checkpoint: chat=True but the tokenizer at {self.path!r} "
                             "has no chat template; set chat=False")
        tok = HFTokenizer(hf_tok, model, self.path, chat=chat, system=self.system)
        return Policy(model=model, tokenizer=tok, remedy=(
            "set policy.path to a checkpoint whose tokenizer covers them, or change the task"),
            io=TORCH_IO)

    def export(self, policy: Policy, weights: Path, out: Path, *, lora: str,
               base: Callable[[Policy], None]) -> list[str]:
        """A checkpoint of this policy as a transformers folder (stages.engines.export)."""
        return export_policy(policy, weights, out, lora=lora, base=base)


def _hf_decoder(path: str) -> Callable[[Sequence[int]], str] | None:
    """``decode`` of the transformers tokenizer at ``path`` (None: no such directory)."""
    if not Path(path).is_dir():
        return None
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(path, local_files_only=True)
    return lambda ids: str(hf.decode(list(ids), skip_special_tokens=False))


class HFTokenizer:
    """Adapts a transformers tokenizer to :class:`gfcr.core.engine.Tokenizer`.

    ``encode`` adds no special tokens; ``encode_prompt`` (:func:`gfcr.core.engine.encode_prompt`)
    renders a task prompt as a user message through the chat template when ``chat``;
    ``decode`` skips special tokens. A missing pad id falls back to eos.
    ``stop_token_ids`` are the eos ids of the model's generation config (a chat model's
    end of turn) besides the tokenizer's own eos.
    """

    def __init__(self, hf_tokenizer: Any, model: Any = None, where: str = "", *,
                 chat: bool = False, system: str | None = None) -> None:
        self.hf, self.chat, self.system = hf_tokenizer, chat, system
        eos = hf_tokenizer.eos_token_id
        if eos is None and model is not None:
            # getattr: transformers config, None when unset
            eos = getattr(model.config, "eos_token_id", None)
            eos = eos[0] if isinstance(eos, (list, tuple)) and eos else eos
        if not isinstance(eos, int):
            raise ValueError(f"hf_checkpoint: tokenizer at {where!r} has no eos token id "
                             f"(got {eos!r}); generation could never stop on EOS")
        self.eos_token_id: int = eos
        pad = hf_tokenizer.pad_token_id
        self.pad_token_id: int = eos if pad is None else int(pad)
        self.stop_token_ids: tuple[int, ...] = _generation_eos(model, eos)

    def encode_prompt(self, text: str) -> list[int]:
        """``text`` as the model sees a prompt: a user turn through the chat template
        with the assistant's generation prompt after it, or plain ``encode``."""
        if not self.chat:
            return self.encode(text)
        messages = [{"role": "user", "content": text}]
        if self.system is not None:
            messages.insert(0, {"role": "system", "content": self.system})
        return template_ids(self, lambda ms, _: str(self.hf.apply_chat_template(
            ms, tokenize=False, add_generation_prompt=True)), messages, None)

    def render_chat(self, messages: list[dict[str, Any]], *,
                    tools: list[dict[str, Any]] | None, add_generation_prompt: bool) -> str:
        """``messages`` (and ``tools``) through the chat template as text, with the system
        message ``encode_prompt`` uses when they have none (gfcr.chat.formats.RendersChat)."""
        if self.system is not None and (not messages or messages[0]["role"] != "system"):
            messages = [{"role": "system", "content": self.system}, *messages]
        return str(self.hf.apply_chat_template(messages, tools=tools, tokenize=False,
                                               add_generation_prompt=add_generation_prompt))

    @property
    def specials(self) -> tuple[str, ...]:
        """The special-token strings the tokenizer would read as ids (gfcr.chat.specials)."""
        return tuple(sorted({str(t.content) for t in self.hf.added_tokens_decoder.values()
                             if t.special} | set(self.hf.all_special_tokens)))

    def encode(self, text: str) -> list[int]:
        """``text`` as text: a special-token string inside it (``<|im_end|>`` in a tool's
        output or a task prompt) is split like any text, never read as its id, so
        content cannot close a turn or open one (gfcr.chat.specials)."""
        return list(self.hf.encode(text, add_special_tokens=False, split_special_tokens=True))

    def encode_template(self, text: str) -> list[int]:
        """A chat template's markup, its special-token strings read as their ids."""
        return list(self.hf.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int]) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=True)

    def save_pretrained(self, folder: str) -> None:
        """The tokenizer's files, chat template included (``gfcr export``)."""
        self.hf.save_pretrained(folder)


def _generation_eos(model: Any, eos: int) -> tuple[int, ...]:
    """``eos`` and the eos ids of the model's generation config (int or list)."""
    # getattr: a model without a generation config (plain torch modules) has none
    config = getattr(model, "generation_config", None)
    more = getattr(config, "eos_token_id", None)
    more = [] if more is None else [more] if isinstance(more, int) else list(more)
    return tuple(sorted({eos, *map(int, more)}))
