"""How long a conversation the agent endpoint accepts, checked cheaply before rendering.

A request is refused (HTTP 400, ``context_length_exceeded``, as OpenAI's API answers)
when its prompt cannot fit the policy's context: first by its size in characters,
before anything is rendered (a 14 MB message is refused without becoming 14 M ids:
drill A1), then by its rendered ids. The character bound is sound: a token covers at
most :func:`max_token_chars` characters of text, so a conversation of more characters
than ``context * max_token_chars`` has more tokens than the context holds.

The context is the smallest of ``AgentEnv.max_context`` and the policy's
``max_position_embeddings``; a fleet server's ``--max-model-len`` may be shorter still,
and the server's own refusal of that one request (an HTTP 400) then fails it alone
(:class:`gfcr.core.engine.RequestRefused`).
"""

from __future__ import annotations

from typing import Any

from gfcr.core.capabilities import ContextLength
from stages.engines.tiny import HFTokenizer
from stages.engines.tokenizers import ByteTokenizer, CharTokenizer

DEFAULT_TOKEN_CHARS = 64
"""Characters per token assumed of a tokenizer whose vocabulary cannot be read."""


def policy_context(engine: Any) -> int | None:
    """The policy's context in tokens, or None when the engine does not say
    (gfcr.core.capabilities.ContextLength)."""
    return engine.context_length() if isinstance(engine, ContextLength) else None


def context_limit(engine: Any, configured: int | None) -> int | None:
    """The tokens a call's prompt and completion may hold (None: no limit known)."""
    known = [v for v in (configured, policy_context(engine)) if v is not None]
    return min(known) if known else None


def max_token_chars(tokenizer: Any) -> int:
    """The most characters one token of ``tokenizer`` stands for: its longest
    vocabulary entry (a byte or character tokenizer's is 1)."""
    if isinstance(tokenizer, (ByteTokenizer, CharTokenizer)):
        return 1
    if not isinstance(tokenizer, HFTokenizer):  # gfcr's wrapper of a transformers tokenizer
        return DEFAULT_TOKEN_CHARS
    try:
        vocab = tokenizer.hf.get_vocab()
    except Exception:  # noqa: BLE001 - a tokenizer without a readable vocabulary
        return DEFAULT_TOKEN_CHARS
    return max((len(t) for t in vocab), default=DEFAULT_TOKEN_CHARS) + 1


def text_chars(value: Any, cap: int) -> int:
    """Characters of the strings in ``value`` (a request's messages and tools), counted
    up to a little past ``cap`` (enough to know it is over), without recursion."""
    total, stack = 0, [value]
    while stack and total <= cap:
        item = stack.pop()
        if isinstance(item, str):
            total += len(item)
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return total


def depth(value: Any, limit: int) -> bool:
    """Whether ``value`` nests no deeper than ``limit`` lists and objects."""
    stack = [(value, 0)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, (dict, list)):
            if level >= limit:
                return False
            stack.extend((v, level + 1) for v in (item.values() if isinstance(item, dict)
                                                  else item))
    return True
