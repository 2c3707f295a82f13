"""gfcr report's sample trajectories as a chat, over stored multi-turn rows (a real DuckLake
store): one bubble per turn with role, source, tool and error, masked tokens struck
through; a single-turn run gets no chat section."""

from __future__ import annotations

import re

from gfcr.report import report_html
from gfcr.report.chat import CHAT_SAMPLES, render_chats
from gfcr.report.data import reads
from store import RolloutStore
from tests.resources.agentic import PROMPT, committed_run, episodes, turn
from tests.resources.runs import synthetic_run


def _trajectory(error=None, answer_mask=None):
    return [turn("environment", PROMPT), turn("policy", [5, 6]),
            turn("tool", [7, 8], tool_name="python", tool_error=error),
            turn("policy", [9, 10, 11], mask=answer_mask, reward=1.0)]


def test_sample_trajectories_render_one_bubble_per_turn(tmp_path):
    rows = episodes([_trajectory(), _trajectory("ZeroDivisionError: division by zero"),
                     _trajectory(answer_mask=[True, False, False])],
                    rewards=[1.0, 0.0, 0.0], groups=["g", "g", "g"])
    with RolloutStore.open(tmp_path / "store") as s:
        committed_run(s, "agent", [rows])
        synthetic_run(s, "single", [{}])
        html = report_html(s, ["agent"])
        single = report_html(s, ["single"])
        picked = reads(s).chat_samples("agent", CHAT_SAMPLES).to_pylist()
    assert sorted(p["kind"] for p in picked) == ["right", "tool error", "wrong"]
    assert "Sample trajectories" in html and "Sample trajectories" not in single
    assert html.count('class="chat"') == 3 and html.count('class="bubble') == 12
    assert "tool python" in html and "error: ZeroDivisionError: division by zero" in html
    # every turn as text, decoded with the run's own tokenizer (the tiny pipeline's
    # characters: ids 5 6 are "23"), its ids on demand; not "13 122 117 ..."
    assert "<pre>23</pre><details><summary>ids</summary><code>5 6</code>" in html
    assert '6<span class="masked">78</span>' in html
    wrong = next(p for p in picked if p["kind"] == "wrong")
    # its answer turn: 9 in the loss, 10 11 struck through
    assert re.search(r'9<span class="masked">10 11</span>', render_chats([wrong]))
    assert "3 tokens, 1 in the loss" in render_chats([wrong])


def test_a_tokenizer_shows_each_turns_text(tmp_path):
    letters = episodes([_trajectory(answer_mask=[True, False, False])], rewards=[0.0])
    with RolloutStore.open(tmp_path / "store") as s:
        committed_run(s, "agent", [letters])
        picked = reads(s).chat_samples("agent", CHAT_SAMPLES).to_pylist()
    html = render_chats(picked, decode=lambda ids: "".join(chr(ord("a") + i) for i in ids))
    assert "bc" in html and "fg" in html and 'j<span class="masked">kl</span>' in html
