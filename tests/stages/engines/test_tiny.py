"""Tiny policies: the character tokenizer, TinyLlama, and loading a local checkpoint."""

from __future__ import annotations

import string

import pytest
import torch
from pydantic import ValidationError

from gfcr.core.engine import Tokenizer
from gfcr.core.registry import REGISTRY
from stages.engines.tiny import (ByteTokenizer, CharTokenizer, HFCheckpoint, HFTokenizer,
                                 TinyLlama)

SMALL = dict(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)


def test_char_tokenizer_round_trips_printable_ascii():
    tok = CharTokenizer()
    assert isinstance(tok, Tokenizer)
    text = "".join(c for c in string.printable if c not in "\x0b\x0c")
    ids = tok.encode(text)
    assert ids == list(range(3, tok.vocab_size)) and tok.vocab_size == 101
    assert tok.decode(ids) == text
    assert tok.decode([tok.bos_token_id] + tok.encode("a+b") + [tok.eos_token_id, 0]) == "a+b"
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (0, 1, 2)


def test_char_tokenizer_names_the_unknown_character():
    with pytest.raises(ValueError, match=r"'é' at position 2"):
        CharTokenizer().encode("caé")
    with pytest.raises(ValueError, match="id 101"):
        CharTokenizer().decode([5, 101])


def test_byte_tokenizer_round_trips_any_text():
    tok = ByteTokenizer()
    assert isinstance(tok, Tokenizer) and tok.vocab_size == 259
    for text in ("1+1=", "voilà: ë, 数, 🙂", "tab\tnew\nline", ""):
        assert tok.decode(tok.encode(text)) == text
    assert tok.encode("à") == [0xC3 + 3, 0xA0 + 3]
    assert tok.decode([tok.bos_token_id, 0xC3 + 3, tok.eos_token_id, 0]) == "\ufffd"  # half a char
    with pytest.raises(ValueError, match="id 259"):
        tok.decode([259])


def test_tiny_llama_is_registered_and_strict():
    assert REGISTRY["policy"]["tiny_llama"] is TinyLlama
    assert REGISTRY["policy"]["hf_checkpoint"] is HFCheckpoint
    with pytest.raises(ValidationError, match="must divide"):
        TinyLlama(hidden_size=30, num_heads=4)
    with pytest.raises(ValidationError):
        TinyLlama(hidden=64)


def test_tiny_llama_builds_a_seeded_llama():
    from transformers import LlamaForCausalLM

    a, b, c = (TinyLlama(**SMALL).build(seed=s) for s in (0, 0, 1))
    assert isinstance(a.model, LlamaForCausalLM) and a.version == 0
    cfg = a.model.config
    assert (cfg.vocab_size, cfg.pad_token_id, cfg.bos_token_id, cfg.eos_token_id) == (259, 0, 1, 2)
    assert isinstance(a.tokenizer, ByteTokenizer) and a.remedy == ""
    char = TinyLlama(**SMALL, tokenizer="char").build(seed=0)
    assert char.model.config.vocab_size == 101 and isinstance(char.tokenizer, CharTokenizer)
    assert "policy.tokenizer='byte'" in char.remedy
    assert next(a.model.parameters()).dtype == torch.float32
    for x, y in zip(a.model.parameters(), b.model.parameters()):
        assert torch.equal(x, y)
    assert not torch.equal(a.model.lm_head.weight, c.model.lm_head.weight)


def test_tiny_llama_defaults_are_under_a_million_parameters():
    n = sum(p.numel() for p in TinyLlama().build(seed=0).model.parameters())
    assert 500_000 < n < 1_000_000


def _char_tokenizer_fast():
    from tokenizers import Regex, Tokenizer as RawTokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<bos>": 1, "<eos>": 2}
    vocab.update({c: i + 3 for i, c in enumerate(string.ascii_letters + string.digits + "+= ")})
    raw = RawTokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    raw.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    raw.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=raw, bos_token="<bos>", eos_token="<eos>",
                                   pad_token="<pad>"), len(vocab)


def _save_tiny(tmp_path, hf_tok, vocab_size):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, pad_token_id=0, bos_token_id=1,
        eos_token_id=2))
    model.save_pretrained(tmp_path)
    hf_tok.save_pretrained(tmp_path)
    return model


def test_hf_checkpoint_loads_a_local_model_and_tokenizer(tmp_path):
    hf_tok, size = _char_tokenizer_fast()
    saved = _save_tiny(tmp_path, hf_tok, size)
    policy = HFCheckpoint(path=str(tmp_path)).build(seed=0)
    tok = policy.tokenizer
    assert isinstance(tok, Tokenizer)
    assert (tok.eos_token_id, tok.pad_token_id) == (2, 0)
    ids = tok.encode("ab 12+3")
    assert ids == [vocab_id for vocab_id in hf_tok.encode("ab 12+3", add_special_tokens=False)]
    assert len(ids) == 7 and tok.decode([1] + ids + [2]) == "ab 12+3"
    x = torch.tensor([ids])
    with torch.no_grad():
        assert torch.allclose(policy.model(input_ids=x).logits, saved(input_ids=x).logits)
    assert next(policy.model.parameters()).dtype == torch.float32


def test_hf_tokenizer_pad_falls_back_to_eos():
    hf_tok, _ = _char_tokenizer_fast()
    hf_tok.pad_token = None
    assert HFTokenizer(hf_tok).pad_token_id == 2


def test_hf_checkpoint_missing_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere"):
        HFCheckpoint(path=str(tmp_path / "nowhere")).build(seed=0)


def test_hf_checkpoint_resolves_a_hub_id_from_the_cache_offline(tmp_path, monkeypatch):
    """A hub id is found in a Hugging Face cache laid out as huggingface_hub writes it
    (refs/main -> snapshots/<commit>/files) with the hub offline: nothing is fetched; an
    id or revision the cache lacks fails naming the id, the revision and the cache."""
    from huggingface_hub import constants

    cache, commit = tmp_path / "hub", "0" * 39 + "1"
    repo = cache / "models--acme--tiny-sums"
    hf_tok, size = _char_tokenizer_fast()
    saved = _save_tiny(repo / "snapshots" / commit, hf_tok, size)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    policy = HFCheckpoint(path="acme/tiny-sums").build(seed=0)
    x = torch.tensor([policy.tokenizer.encode("ab 12+3")])
    with torch.no_grad():
        assert torch.allclose(policy.model(input_ids=x).logits, saved(input_ids=x).logits)
    pinned = HFCheckpoint(path="acme/tiny-sums", revision=commit).build(seed=0)
    assert pinned.tokenizer.encode("ab") == policy.tokenizer.encode("ab")
    with pytest.raises(FileNotFoundError, match=r"hub id 'acme/tiny-sums' \(revision 'v2'\) "
                                                rf"is not in the Hugging Face cache '{cache}' "
                                                r"and the hub is offline"):
        HFCheckpoint(path="acme/tiny-sums", revision="v2").build(seed=0)
    with pytest.raises(FileNotFoundError, match="hub id 'acme/other'"):
        HFCheckpoint(path="acme/other").build(seed=0)
    with pytest.raises(ValueError, match="revision='v2' applies to a hub id"):
        HFCheckpoint(path=str(repo / "snapshots" / commit), revision="v2").build(seed=0)
