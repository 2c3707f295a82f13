"""gfcr.chat.formats: conversations appended as token ids, never re-rendered, with the byte
tokenizer (plain format) and a trained BPE tokenizer with a ChatML template."""

from __future__ import annotations

import pyarrow as pa
import pytest

from gfcr.chat.formats import PlainFormat, TemplateFormat, chat_format
from gfcr.core.trajectory import Trajectory
from gfcr.core.engine import encode_prompt
from gfcr.core.environment import Message, Tool
from gfcr.core.trajectory import TURNS_TYPE, loss_mask
from stages.engines.tiny import HFTokenizer
from stages.engines.tokenizers import EOS_ID, ByteTokenizer
from tests.resources.chat import bpe_tokenizer, chat_tokenizer

Q = "What is 12 + 7?"


def test_plain_format_first_turn_is_the_single_turn_prompt_and_eos_closes_a_cut_turn() -> None:
    tok = ByteTokenizer()
    fmt = chat_format(tok)
    assert isinstance(fmt, PlainFormat)
    traj = Trajectory(fmt)
    traj.start([Message("user", Q)])
    assert traj.prompt_ids == encode_prompt(tok, Q)
    first = tok.encode("18") + [EOS_ID]
    traj.add_policy(first, [-0.5, -0.25, -0.125])
    traj.observe([Message("user", "wrong, try again")])
    cut = tok.encode("2")  # hit its token cap: no EOS
    traj.add_policy(cut, [-1.0])
    traj.observe([Message("tool", "19")], tool_name="python", tool_error="timeout")
    turns = traj.rows()
    assert [t["source"] for t in turns] == ["environment", "policy", "environment", "policy",
                                           "tool"]
    assert turns[1]["token_ids"] == first and turns[3]["token_ids"] == cut
    assert turns[2]["token_ids"] == tok.encode("\nwrong, try again")  # closed by its EOS
    assert turns[4]["token_ids"] == [EOS_ID] + tok.encode("\n<tool_response>19</tool_response>")
    assert (turns[4]["tool_name"], turns[4]["tool_error"]) == ("python", "timeout")
    assert traj.ids() == traj.prompt_ids + traj.completion_ids
    assert traj.completion_ids == first + turns[2]["token_ids"] + cut + turns[4]["token_ids"]
    n2, n4 = len(turns[2]["token_ids"]), len(turns[4]["token_ids"])
    assert traj.logprobs == [-0.5, -0.25, -0.125] + [0.0] * n2 + [-1.0] + [0.0] * n4
    assert loss_mask(turns) == [True] * 3 + [False] * n2 + [True] + [False] * n4
    pa.array([turns], TURNS_TYPE)  # the turns column's type holds them


def test_plain_format_lists_tools_before_the_first_messages() -> None:
    tok = ByteTokenizer()
    tool = Tool("python", "Run Python", {"type": "object", "properties": {"code": {"type": "string"}}})
    text = tok.decode(PlainFormat(tok).first([Message("user", Q)], [tool]))
    assert text.startswith("Tools: [") and '"name": "python"' in text and text.endswith("\n" + Q)


def test_template_first_turn_is_encode_prompt_and_ids_render_the_whole_conversation() -> None:
    tok = chat_tokenizer()
    fmt = chat_format(tok)
    assert isinstance(fmt, TemplateFormat)
    traj = Trajectory(fmt)
    traj.start([Message("user", Q)])
    assert traj.prompt_ids == tok.encode_prompt(Q)
    # the policy's ids one byte-level piece at a time: not how the tokenizer would
    # encode its text, so a re-tokenization would change them
    reply = [tok.hf.convert_tokens_to_ids(c) for c in "hello"] + [tok.eos_token_id]
    assert len(tok.encode("hello")) < 5  # BPE merges it
    traj.add_policy(reply, [-0.1] * len(reply))
    traj.observe([Message("user", "wrong, try again")])
    second = tok.encode("The answer is 19.") + [tok.eos_token_id]
    traj.add_policy(second, [-0.2] * len(second))
    assert traj.rows()[1]["token_ids"] == reply and traj.rows()[3]["token_ids"] == second
    conversation = [{"role": "user", "content": Q}, {"role": "assistant", "content": "hello"},
                    {"role": "user", "content": "wrong, try again"},
                    {"role": "assistant", "content": "The answer is 19."}]
    rendered = tok.render_chat(conversation, tools=None, add_generation_prompt=False)
    text = tok.hf.decode(traj.ids(), skip_special_tokens=False)
    assert rendered.startswith(text) and rendered[len(text):] == "\n"  # all but the "\n"
    assert tok.encode(text) != traj.ids()  # re-tokenizing would not give the trained ids
    assert traj.rows()[2]["token_ids"][0] != tok.eos_token_id  # the policy's EOS, kept once


def test_template_delta_closes_a_cut_policy_turn_with_the_templates_end_of_turn() -> None:
    tok = chat_tokenizer()
    traj = Trajectory(chat_format(tok))
    traj.start([Message("user", Q)])
    traj.add_policy(tok.encode("1"), [-0.3])
    traj.observe([Message("tool", "12", name="python")], tool_name="python")
    delta = traj.rows()[2]["token_ids"]
    assert delta[0] == tok.eos_token_id
    assert tok.hf.decode(delta, skip_special_tokens=False) == (
        "<|im_end|>\n<|im_start|>tool\n12<|im_end|>\n<|im_start|>assistant\n")
    assert traj.rows()[2]["source"] == "tool"


def test_template_renders_tools_in_the_first_turn() -> None:
    tok = chat_tokenizer()
    ids = TemplateFormat(tok).first([Message("user", Q)], [Tool("python", "Run Python")])
    assert tok.hf.decode(ids, skip_special_tokens=False).startswith(
        '<|im_start|>system\nTools: [{"type": "function", "function": {"name": "python", '
        '"description": "Run Python"')


def test_a_template_that_rewrites_earlier_turns_is_refused() -> None:
    tok = HFTokenizer(bpe_tokenizer(), chat=True)
    tok.hf = _copy_with_template(  # renders the last message only: not append-only
        "{% for m in messages[-1:] %}{{ m['content'] }}<|im_end|>{% endfor %}")
    with pytest.raises(ValueError, match="renders a longer conversation differently"):
        TemplateFormat(tok).delta([Message("user", "again")], closed=True)


def _copy_with_template(template: str):
    import copy

    hf = copy.deepcopy(bpe_tokenizer())
    hf.chat_template = template
    return hf
