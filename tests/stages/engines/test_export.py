"""stages.engines.export on a transformers checkpoint policy: the folder holds the weights
given, the tokenizer with its chat template and the generation config's stop ids."""

from __future__ import annotations

import torch

from stages.engines.export import export
from stages.engines.tiny import HFCheckpoint
from stages.engines.torch_io import TORCH_IO
from tests.stages.engines.test_tiny import _char_tokenizer_fast, _save_tiny

TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")


def test_a_checkpoint_policy_exports_weights_tokenizer_and_chat_template(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    hf_tok, size = _char_tokenizer_fast()
    hf_tok.chat_template = TEMPLATE
    _save_tiny(tmp_path / "base", hf_tok, size)
    policy = HFCheckpoint(path=str(tmp_path / "base")).build(seed=0)
    with torch.no_grad():  # "trained" weights, different from the base folder's
        for p in policy.model.parameters():
            p.add_(0.01 * torch.randn_like(p))
    TORCH_IO.save_weights(policy.model, tmp_path / "model.safetensors")
    ids = torch.tensor([policy.tokenizer.encode_prompt("ab 12")])
    with torch.no_grad():
        expected = policy.model(input_ids=ids).logits
    fresh = HFCheckpoint(path=str(tmp_path / "base")).build(seed=0)
    files = export(fresh, tmp_path / "model.safetensors", tmp_path / "out", lora="merged",
                   base=lambda _: None)
    assert {"model.safetensors", "config.json", "generation_config.json",
            "tokenizer.json"} <= set(files)
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    tok = AutoTokenizer.from_pretrained(tmp_path / "out")
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, expected)
    assert tok.chat_template == TEMPLATE
    rendered = tok.apply_chat_template([{"role": "user", "content": "ab 12"}], tokenize=False,
                                       add_generation_prompt=True)
    assert tok.encode(rendered, add_special_tokens=False) == ids[0].tolist()
    config = GenerationConfig.from_pretrained(tmp_path / "out")
    assert (config.eos_token_id, config.pad_token_id) == (2, 0)
