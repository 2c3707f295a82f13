"""Sample multi-turn trajectories in the report, drawn as a chat: one bubble per turn.

A bubble names the turn's role and source (the environment, the policy, a tool, a forced
prefix), the tool and its error, the turn's reward, its token count and how many of its
tokens are in the loss, and its behaviour logprob sum. The store keeps token ids, not
text per turn: with the run's tokenizer handed in (``decode``, gfcr.report.decode) every
turn reads as text, masked stretches struck through, and its ids open on demand; without
one, the first turn's text (the row's ``prompt``) and the later turns' ids.
"""

from __future__ import annotations

from collections.abc import Callable
from html import escape

from gfcr.report.rows import Row

CHAT_SAMPLES = 3
"""Multi-turn rows the report draws per run: a right, a wrong one and one with a tool error."""

CSS = """
.chat{border:1px solid #e3e3e3;border-radius:6px;padding:8px;margin:8px 0;max-width:900px}
.bubble{border-radius:8px;padding:5px 9px;margin:5px 0;max-width:760px}
.bubble .head{font-size:11px;color:#555} .bubble pre{max-width:740px}
.src-environment{background:#f2f2f2} .src-tool{background:#fff3e0;margin-left:24px}
.src-policy{background:#e7f0ff;margin-left:48px} .src-forced{background:#efe7ff;margin-left:48px}
.masked{text-decoration:line-through;color:#999} .err{color:#b42318}
"""

Decode = Callable[[list[int]], str]



def render_chats(samples: list[Row], decode: Decode | None = None) -> str:
    """The chats of ``samples`` (the store's ``RunReads.chat_samples`` rows), as HTML."""
    return "".join(
        f'<div class="chat"><small>step {s["step"]} · {escape(s["kind"])} · reward '
        f'{_num(s["reward"])} · {escape(s["rollout_id"])}</small>'
        + "".join(_bubble(k, t, s["prompt"], decode) for k, t in enumerate(s["turns"]))
        + "</div>" for s in samples)


def _bubble(k: int, turn: Row, prompt: str, decode: Decode | None) -> str:
    ids = list(turn["token_ids"] or [])
    mask = turn["mask"]
    in_loss = sum(bool(m) for m in mask) if mask else 0
    head = [f"turn {k}", turn["role"], turn["source"]]
    if turn["tool_name"]:
        head.append(f"tool {turn['tool_name']}")
    head.append(f"{len(ids)} tokens, {in_loss} in the loss")
    if turn["reward"] is not None:
        head.append(f"reward {_num(turn['reward'])}")
    if turn["logprobs"]:
        head.append(f"logprob sum {sum(turn['logprobs']):.3g}")
    error = (f'<div class="err">error: {escape(_clip(turn["tool_error"]))}</div>'
             if turn["tool_error"] else "")
    body = _text(ids, mask, prompt if k == 0 else None, decode)
    ids_html = (f"<details><summary>ids</summary><code>{escape(' '.join(map(str, ids)))}</code></details>"
                if decode is not None and ids else "")
    return (f'<div class="bubble src-{escape(turn["source"])}"><div class="head">'
            f"{escape(' · '.join(head))}</div><pre>{body}</pre>{ids_html}{error}</div>")


def _text(ids: list[int], mask: list[bool] | None, prompt: str | None,
          decode: Decode | None) -> str:
    """The turn's text (the prompt, or decoded) or its ids; stretches out of the loss of
    an assistant turn struck through."""
    if prompt is not None and decode is None:
        return escape(_clip(prompt))
    spans: list[tuple[bool, list[int]]] = []
    for j, token in enumerate(ids):
        masked = mask is not None and not mask[j]
        if spans and spans[-1][0] == masked:
            spans[-1][1].append(token)
        else:
            spans.append((masked, [token]))
    out = []
    for masked, part in spans:
        shown = escape(_clip(decode(part) if decode else " ".join(map(str, part))))
        out.append(f'<span class="masked">{shown}</span>' if masked else shown)
    return "".join(out)


def _clip(text: str, n: int = 600) -> str:
    return text if len(text) <= n else text[:n] + " …"


def _num(v: float | None) -> str:
    return "–" if v is None else f"{v:.3g}"
