"""A real BPE tokenizer with a chat template, trained here (no download), and a tiny
Llama over its vocabulary: what multi-turn tests use beside the byte tokenizer.

The template is ChatML (``<|im_start|>role\\n...<|im_end|>\\n``, the layout of SmolLM2's
and Qwen's), with tools listed in a system block when given; ``<|im_end|>`` is EOS.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

CHATML = (
    "{%- if tools %}<|im_start|>system\nTools: {{ tools | tojson }}<|im_end|>\n{% endif -%}"
    "{%- for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")

CORPUS = [
    "What is 12 + 7? The answer is 19.", "wrong, try again", "Guess a number from 1 to 20.",
    "higher", "lower", "correct", "<tool_call>{\"name\": \"python\", \"arguments\": "
    "{\"code\": \"print(3 * 4)\"}}</tool_call>", "<tool_response>12</tool_response>",
    "State the final answer to the following arithmetic problem: 4 + 7 - 2 =",
    "hello hello world, the quick brown fox jumps over the lazy dog 0123456789",
]


@lru_cache(maxsize=1)
def bpe_tokenizer() -> Any:
    """A transformers fast tokenizer: byte-level BPE (vocabulary 400) trained on
    :data:`CORPUS`, ``<|im_start|>``/``<|im_end|>``/``<pad>`` as special tokens, the
    ChatML template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<pad>", "<|im_start|>",
                                                                   "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS * 4, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>",
                                   pad_token="<pad>", bos_token="<|im_start|>")
    fast.chat_template = CHATML
    return fast


def chat_tokenizer() -> Any:
    """:func:`bpe_tokenizer` as gfcr sees a chat model's tokenizer (chat on)."""
    from stages.engines.tiny import HFTokenizer

    return HFTokenizer(bpe_tokenizer(), chat=True)


def chat_policy(seed: int = 0) -> Any:
    """A tiny Llama (hidden 32, one layer) over :func:`bpe_tokenizer`'s vocabulary, with
    the chat tokenizer: a real chat-model policy in miniature."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from gfcr.core.policy import Policy
    from stages.engines.torch_io import TORCH_IO

    hf = bpe_tokenizer()
    config = LlamaConfig(vocab_size=len(hf), hidden_size=32, intermediate_size=64,
                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                         max_position_embeddings=1024, eos_token_id=hf.eos_token_id,
                         pad_token_id=hf.pad_token_id, bos_token_id=hf.bos_token_id)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    return Policy(model=model, tokenizer=chat_tokenizer(), io=TORCH_IO)


class Recording:
    """A real engine that keeps every ``generate`` call's requests and outputs, so a test
    can compare what was generated with what was stored (nothing is replaced)."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.calls: list[tuple[list[Any], list[Any]]] = []

    @property
    def policy(self) -> Any:
        return self.engine.policy

    @property
    def version(self) -> int:
        return int(self.engine.version)

    def encode(self, text: str) -> list[int]:
        return list(self.engine.encode(text))

    def decode(self, ids: list[int]) -> str:
        return str(self.engine.decode(ids))

    def forced_logprobs(self, prompt_ids: list[int], ids: list[int],
                        temperature: float) -> list[float]:
        return list(self.engine.forced_logprobs(prompt_ids, ids, temperature))

    def generate(self, requests: list[Any], params: Any, on_segment: Any = None) -> list[Any]:
        outputs = self.engine.generate(requests, params, on_segment)
        self.calls.append((list(requests), list(outputs)))
        return list(outputs)

    def update_weights(self, state: Any = None) -> int:
        return int(self.engine.update_weights(state))
