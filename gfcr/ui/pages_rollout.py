"""One rollout (``/runs/RUN_ID/rollouts/ROLLOUT_ID``): its facts, its lineage, and its
turns as a chat timeline (role, source, tool call and result, tool error, per-turn reward
and advantage), each token coloured by its behaviour log-probability and marked in or out
of the loss; text decoded with the run's tokenizer (gfcr.report.decode), ids on demand."""

from __future__ import annotations

import math
from html import escape

from gfcr.report.decode import Decode, run_decoder, safe
from gfcr.ui.context import PageContext, UiError
from gfcr.ui.html import clip, href, num, page, seg, when
from gfcr.report.rows import Row

MAX_TOKENS = 4000
"""Tokens of one turn drawn one by one; a longer turn shows its text whole after them."""


def rollout_page(ctx: PageContext, run_id: str, rollout_id: str) -> str:
    run = ctx.run(run_id)
    row = ctx.browse().rollout(run_id, rollout_id)
    if row is None:
        raise UiError(404, f"no rollout {rollout_id!r} in run {run_id!r} "
                           f"(browse them at /runs/{run_id}/rollouts)")
    decode = safe(run_decoder(run.get("spec_yaml")))
    note = ("" if decode is not None else
            '<p class="muted">the run\'s tokenizer is not available here: turns show token ids</p>')
    body = (_facts(run_id, row) + _lineage(ctx, run_id, row) + note
            + '<h2>Turns <small>(underlined: in the loss; struck: out of it; colour: log-probability)</small></h2>'
            + _timeline(row, decode))
    return page(f"Rollout {rollout_id}", body,
                crumbs=[(run_id, f"/runs/{seg(run_id)}"), ("rollouts", f"/runs/{seg(run_id)}/rollouts"),
                        (f"step {row['step']}", href(f"/runs/{seg(run_id)}/rollouts", {"step": row["step"]}))])


def _facts(run_id: str, row: Row) -> str:
    run = seg(run_id)
    prompt_link = href(f"/prompts/{seg(row['prompt_id'])}", {"runs": run_id})
    rewards = ", ".join(f"{escape(str(k))}={num(v)}" for k, v in (row.get("rewards") or []))
    kept = ("kept" if row["kept"] else
            f'<span class="dropped" id="drop-reason">dropped by {escape(row["dropped_by"] or "?")}: '
            f'{escape(row["drop_reason"] or "?")}</span>')
    items = [
        ("step", str(row["step"])),
        ("group", f'<a href="/runs/{run}/groups/{seg(row["group_id"])}">{escape(row["group_id"])}</a> '
                  f'sample #{row["sample_idx"]}'),
        ("prompt", f'<a href="{escape(prompt_link)}">{escape(row["prompt_id"])}</a> (across steps)'),
        ("reward", f"{num(row['reward'])}{' (' + rewards + ')' if rewards else ''}"),
        ("advantage", num(row.get("advantage"))), ("kept", kept),
        ("finish / status", f"{escape(row['finish_reason'] or '')} / {escape(row['status'] or '')}"),
        ("policy version", f"{row['policy_version_start']} → {row['policy_version_end']}"),
        ("tokens", num(row["n_tokens"])), ("generation seconds", num(row.get("gen_seconds"))),
        ("server", escape(str(row.get("server") or "–"))), ("episode end", escape(str(row.get("episode_end") or "–"))),
        ("answer", clip(row.get("answer"), 200)), ("created", when(row.get("created_at"))),
    ]
    if row.get("score_error"):
        items.append(("score error", f'<span class="error">{clip(row["score_error"], 400)}</span>'))
    return "<dl class=\"facts\">" + "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in items) + "</dl>"


def _lineage(ctx: PageContext, run_id: str, row: Row) -> str:
    run = seg(run_id)
    parent = row.get("parent_id")
    parts = [f"parent: <a href=\"/runs/{run}/rollouts/{seg(parent)}\">{escape(parent)}</a>" if parent
             else "parent: none (a fresh sample)",
             f"replayed {row.get('replay_count') or 0} time(s)",
             f"trained on at step {num(row.get('consumed_at_step'))}"]
    children = ctx.browse().children(run_id, row["rollout_id"]).to_pylist()
    if children:
        parts.append("continued or branched into: " + ", ".join(
            f'<a href="/runs/{run}/rollouts/{seg(c["rollout_id"])}">{escape(c["rollout_id"])}</a> '
            f"(step {c['step']}, reward {num(c['reward'])})" for c in children))
    return '<h2>Lineage</h2><ul id="lineage">' + "".join(f"<li>{p}</li>" for p in parts) + "</ul>"


def _timeline(row: Row, decode: Decode | None) -> str:
    turns = row.get("turns") or []
    advantages = row.get("turn_advantages") or []
    out = []
    for k, turn in enumerate(turns):
        ids = list(turn.get("token_ids") or [])
        mask = turn.get("mask")
        head = [f"turn {k}", turn.get("role") or "?", turn.get("source") or "?"]
        if turn.get("tool_name"):
            head.append(f"tool call: {turn['tool_name']}")
        head.append(f"{len(ids)} tokens, {sum(bool(m) for m in mask) if mask else 0} in the loss")
        if turn.get("reward") is not None:
            head.append(f"turn reward {num(turn['reward'])}")
        if k < len(advantages) and advantages[k] is not None:
            head.append(f"turn advantage {num(advantages[k])}")
        error = (f'<div class="error tool-error">tool error: {clip(turn["tool_error"], 800)}</div>'
                 if turn.get("tool_error") else "")
        text = _tokens(ids, turn.get("logprobs"), mask, decode) if decode else escape(" ".join(map(str, ids)))
        ids_html = f"<details><summary>token ids</summary><code>{escape(' '.join(map(str, ids)))}</code></details>"
        out.append(f'<div class="turn src-{escape(turn.get("source") or "")}" data-turn="{k}">'
                   f'<div class="head">{escape(" · ".join(head))}</div>'
                   f'<div class="text">{text}</div>{ids_html}{error}</div>')
    return f'<div id="timeline">{"".join(out) or "<p>no turns</p>"}</div>'


def _tokens(ids: list[int], logprobs: list[float] | None, mask: list[bool] | None, decode: Decode) -> str:
    """Each token a span: coloured by log-probability where the turn has them, marked in or
    out of the loss where it has a mask; a turn of neither (the environment's, a tool's)
    as its decoded text."""
    if not logprobs and mask is None:
        return f'<span class="plain">{escape(decode(ids))}</span>'
    spans = []
    for j, token in enumerate(ids[:MAX_TOKENS]):
        lp = logprobs[j] if logprobs and j < len(logprobs) else None
        in_loss = bool(mask[j]) if mask is not None and j < len(mask) else False
        colour = "" if lp is None else f' style="background:{_colour(lp)}"'
        title = f"id {token} · logprob {num(lp)} · {'in' if in_loss else 'out of'} the loss"
        spans.append(f'<span class="tok {"in" if in_loss else "out"}"{colour} title="{escape(title)}">'
                     f"{escape(decode([token]))}</span>")
    if len(ids) > MAX_TOKENS:
        spans.append(f'<span class="plain">{escape(decode(ids[MAX_TOKENS:]))}</span>')
    return "".join(spans)


def _colour(logprob: float) -> str:
    """Green for a likely token (p near 1), through yellow, to red for an unlikely one."""
    p = math.exp(max(-20.0, min(0.0, float(logprob))))
    return f"hsl({120 * p:.0f},70%,85%)"

