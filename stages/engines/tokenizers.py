"""File-free tokenizers for the tiny policy: bytes (all of Unicode) and printable ASCII.

Both put ``0=pad, 1=bos, 2=eos`` first and need no download, so a tiny policy's ids never
drift between runs. ``encode`` adds no special tokens; ``decode`` drops them.

:class:`ByteTokenizer` (the default) encodes any text as its UTF-8 bytes, one id per
byte, so every task's prompts and answers can be tokenised (an "à" is two ids); this is
the byte-level fallback of GPT-2's BPE and ByT5 (Xue et al. 2022, "ByT5: Towards a
token-free future with pre-trained byte-to-byte models") without any merges.
:class:`CharTokenizer` has one id per printable ASCII character and refuses anything
else: a smaller embedding table for tasks that are plain ASCII.

>>> ByteTokenizer().decode(ByteTokenizer().encode("à = 1"))
'à = 1'
"""

from __future__ import annotations

import string

PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
SPECIAL = 3
"""Ids below this are pad, bos and eos."""
CHARS = "".join(c for c in string.printable if c not in "\x0b\x0c")
"""The character tokenizer's vocabulary, in id order after the special ids."""


class ByteTokenizer:
    """One id per UTF-8 byte (``byte + 3``), after ``0=pad, 1=bos, 2=eos``: 259 ids.

    Round-trips any string. ``decode`` of ids that do not form valid UTF-8 (a policy may
    emit half a character) replaces the broken bytes with U+FFFD instead of raising.
    """

    pad_token_id: int = PAD_ID
    bos_token_id: int = BOS_ID
    eos_token_id: int = EOS_ID
    vocab_size: int = SPECIAL + 256

    def encode(self, text: str) -> list[int]:
        """Ids of ``text``'s UTF-8 bytes."""
        return [b + SPECIAL for b in text.encode("utf-8")]

    def decode(self, ids: list[int]) -> str:
        """Text of ``ids``, skipping pad/bos/eos; ValueError on ids outside the vocab."""
        out = bytearray()
        for i in ids:
            if i >= SPECIAL:
                if i >= self.vocab_size:
                    raise ValueError(f"ByteTokenizer id {i!r} is outside the vocabulary "
                                     f"(size {self.vocab_size})")
                out.append(i - SPECIAL)
            elif i < 0:
                raise ValueError(f"ByteTokenizer id {i!r} is negative")
        return out.decode("utf-8", errors="replace")


class CharTokenizer:
    """One id per printable ASCII character, after ``0=pad, 1=bos, 2=eos``: 101 ids.

    ``encode`` raises ValueError naming the first character outside the vocabulary.
    """

    pad_token_id: int = PAD_ID
    bos_token_id: int = BOS_ID
    eos_token_id: int = EOS_ID
    vocab_size: int = SPECIAL + len(CHARS)

    def __init__(self) -> None:
        self._ids = {c: i + SPECIAL for i, c in enumerate(CHARS)}

    def encode(self, text: str) -> list[int]:
        """Ids of ``text``; ValueError names the first character outside the vocabulary."""
        try:
            return [self._ids[c] for c in text]
        except KeyError:
            pos = next(i for i, c in enumerate(text) if c not in self._ids)
            raise ValueError(f"CharTokenizer cannot encode character {text[pos]!r} at "
                             f"position {pos} of {text[:80]!r}; it knows printable ASCII "
                             "only") from None

    def decode(self, ids: list[int]) -> str:
        """Text of ``ids``, skipping pad/bos/eos; ValueError on ids outside the vocab."""
        out = []
        for i in ids:
            if i >= SPECIAL:
                if i >= self.vocab_size:
                    raise ValueError(f"CharTokenizer id {i!r} is outside the vocabulary "
                                     f"(size {self.vocab_size})")
                out.append(CHARS[i - SPECIAL])
            elif i < 0:
                raise ValueError(f"CharTokenizer id {i!r} is negative")
        return "".join(out)


TOKENIZERS: dict[str, type[ByteTokenizer] | type[CharTokenizer]] = {
    "byte": ByteTokenizer, "char": CharTokenizer}
"""TinyLlama's ``tokenizer`` choices."""
