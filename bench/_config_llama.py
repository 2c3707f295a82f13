"""A config-built Llama policy for benchmarks (bench/learner.py): any size, random
weights under the seed, no tokenizer beyond a pad id (the learner reads only that).
Picklable, so the sharded learner's ranks build the same model from it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Pad:
    """The tokenizer the learner needs: a pad id."""

    pad_token_id: int = 0


@dataclass(frozen=True)
class ConfigLlama:
    """``LlamaForCausalLM(LlamaConfig(...))`` in float32 as a policy component."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    tied: bool = True

    def build(self, *, seed: int) -> Any:
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM

        from gfcr.core.policy import Policy
        from stages.engines.torch_io import TORCH_IO

        config = LlamaConfig(vocab_size=self.vocab, hidden_size=self.hidden,
                             intermediate_size=self.intermediate,
                             num_hidden_layers=self.layers, num_attention_heads=self.heads,
                             num_key_value_heads=self.kv_heads, max_position_embeddings=2048,
                             tie_word_embeddings=self.tied, attn_implementation="sdpa")
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = LlamaForCausalLM(config).float()
        return Policy(model=model, tokenizer=Pad(), io=TORCH_IO)

    @property
    def params(self) -> int:
        attn = self.hidden * self.hidden * 2 + self.hidden * (self.hidden // self.heads) \
            * self.kv_heads * 2
        layer = attn + 3 * self.hidden * self.intermediate + 2 * self.hidden
        return self.layers * layer + self.vocab * self.hidden * (1 if self.tied else 2) \
            + self.hidden


SMOLLM2 = ConfigLlama(layers=30, hidden=576, heads=9, kv_heads=3, intermediate=1536,
                      vocab=49152)
"""SmolLM2-135M's shape (Allal et al. 2025), randomly initialised."""
