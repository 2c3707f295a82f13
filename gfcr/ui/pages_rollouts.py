"""A run's rollouts (``/runs/RUN_ID/rollouts?step=&stage=&kept=&reason=&reward_min=...``)
with a reward histogram whose bars filter, one group side by side
(``/runs/RUN_ID/groups/GROUP_ID``), and one prompt across steps and runs
(``/prompts/PROMPT_ID?runs=A,B``)."""

from __future__ import annotations

from collections.abc import Mapping
from html import escape

from gfcr.core.browse import TEXT_CAP, RolloutPage, RolloutQuery
from gfcr.ui.context import PageContext, UiError
from gfcr.ui.html import clip, href, num, page, seg, table
from gfcr.ui.params import integer, rollout_query, run_list
from gfcr.report.rows import Row

BINS = 20
_FIELDS = (("step", "step", 5), ("kept", "kept (true/false)", 5), ("stage", "dropped by", 12),
           ("reason", "drop reason contains", 14), ("reward_min", "reward ≥", 5),
           ("reward_max", "reward ≤", 5), ("len_min", "tokens ≥", 5), ("len_max", "tokens ≤", 5),
           ("server", "server", 10), ("version", "policy version", 5), ("q", "text or id", 16))


def rollouts_page(ctx: PageContext, run_id: str, params: Mapping[str, str]) -> str:
    ctx.run(run_id)
    query = rollout_query(params)
    browse = ctx.browse()
    every = params.get("count", "") == "all"
    try:
        found = browse.page(run_id, query, BINS, cap=None if every else TEXT_CAP)
    except ValueError as e:  # a filter the store cannot answer (no server column)
        raise UiError(400, f"bad filter: {e}") from e
    base = f"/runs/{seg(run_id)}/rollouts"
    rows, total = found.rows, found.total
    body = (_form(base, query) + _histogram(base, query, found.bars.to_pylist(), _partial(base, query, found))
            + f'<p id="count">{total:,}{"" if found.complete else "+"} rollouts match; showing '
              f"{query.offset + 1 if rows.num_rows else 0}–{query.offset + rows.num_rows}. "
              f"{_pager(base, query, total, found.complete)}</p>"
            + _rows_table(run_id, rows.to_pylist()))
    return page(f"Rollouts of {run_id}", body,
                crumbs=[(run_id, f"/runs/{seg(run_id)}"), ("rollouts", base)],
                data={"page": "rollouts", "runs": [run_id]})


def _form(base: str, query: RolloutQuery) -> str:
    values = query.as_params()
    inputs = "".join(f'<label>{escape(label)} <input name="{name}" size="{size}" '
                     f'value="{escape(values.get(name, ""))}"></label> ' for name, label, size in _FIELDS)
    return (f'<form id="filters" method="get" action="{escape(base)}">{inputs}'
            f'<button type="submit">filter</button> <a href="{escape(base)}">clear</a></form>')


def _partial(base: str, query: RolloutQuery, found: RolloutPage) -> str:
    """What a free-text count that stopped early covers, and the link that counts it all."""
    if found.complete or found.steps is None:
        return ""
    every = href(base, {**query.as_params(), "count": "all"})
    return (f' <span id="partial">over the newest steps {found.steps[0]}–{found.steps[1]}, where the '
            f'text search stopped at {found.total:,} matches; <a href="{escape(every)}">count every step</a>'
            "</span>")


def _histogram(base: str, query: RolloutQuery, bins: list[Row], partial: str = "") -> str:
    """An SVG bar per reward bin, each a link to the rows of that reward range."""
    if not bins:
        return f'<p class="muted">no scored rollout matches: no reward histogram{partial}</p>'
    width, height, top = 600, 120, max(b["n"] for b in bins)
    bar = width / BINS
    params = query.as_params()
    params.pop("offset", None)
    bars = []
    for b in bins:
        h = max(2.0, (height - 20) * b["n"] / top)
        link = href(base, {**params, "reward_min": _edge(b["low"]), "reward_max": _edge(b["high"])})
        bars.append(f'<a href="{escape(link)}" class="hbar" data-n="{b["n"]}"><rect x="{b["bin"] * bar + 1:.1f}" '
                    f'y="{height - 14 - h:.1f}" width="{bar - 2:.1f}" height="{h:.1f}">'
                    f"<title>reward {b['low']:.3g} to {b['high']:.3g}: {b['n']} rollouts</title></rect></a>")
    low, high = bins[0]["low"], bins[-1]["high"]
    axis = (f'<text x="0" y="{height - 2}">{low:.3g}</text>'
            f'<text x="{width}" y="{height - 2}" text-anchor="end">{high:.3g}</text>')
    return (f'<div class="hist"><small>reward histogram (click a bar to filter){partial}</small>'
            f'<svg id="histogram" viewBox="0 0 {width} {height}" width="{width}" height="{height}">'
            f"{''.join(bars)}{axis}</svg></div>")


def _edge(x: float) -> str:
    return f"{x:.6g}"


def _pager(base: str, query: RolloutQuery, total: int, complete: bool = True) -> str:
    params = query.as_params()
    links = []
    if query.offset > 0:
        links.append(f'<a href="{escape(href(base, {**params, "offset": max(0, query.offset - query.limit)}))}">previous</a>')
    if query.offset + query.limit < total or not complete:
        links.append(f'<a id="next" href="{escape(href(base, {**params, "offset": query.offset + query.limit}))}">next</a>')
    return " ".join(links)


def _rows_table(run_id: str, rows: list[Row]) -> str:
    run = seg(run_id)
    cells = [[f'<a href="/runs/{run}/rollouts/{seg(r["rollout_id"])}">{escape(r["rollout_id"])}</a>',
              str(r["step"]), f'<a href="/runs/{run}/groups/{seg(r["group_id"])}">{escape(r["group_id"][:12])}</a>'
              f' #{r["sample_idx"]}', clip(r["prompt"], 60), f"<pre>{clip(r['completion'])}</pre>",
              num(r["reward"]), num(r["advantage"]),
              "kept" if r["kept"] else f'<span class="dropped">dropped by {escape(r["dropped_by"] or "?")}: '
                                       f'{escape(r["drop_reason"] or "?")}</span>',
              num(r["n_tokens"]), escape(r["finish_reason"] or ""), num(r["policy_version_start"]),
              escape(r["server"] or ""), num(r["n_turns"])] for r in rows]
    return table(["rollout", "step", "group", "prompt", "completion", "reward", "advantage", "kept",
                  "tokens", "finish", "version", "server", "turns"], cells, cls="rollouts",
                 tbody_id="rollout-rows")


def group_page(ctx: PageContext, run_id: str, group_id: str) -> str:
    ctx.run(run_id)
    rows = ctx.browse().rollouts(run_id, RolloutQuery(group_id=group_id, limit=500))
    total = rows.num_rows
    if not total:
        raise UiError(404, f"no group {group_id!r} in run {run_id!r}")
    items = sorted(rows.to_pylist(), key=lambda r: r["sample_idx"])
    first = items[0]
    cards = "".join(
        f'<div class="card {"kept" if r["kept"] else "dropped"}"><div class="head">#{r["sample_idx"]} · '
        f'reward {num(r["reward"])} · advantage {num(r["advantage"])} · {num(r["n_tokens"])} tokens'
        + ("" if r["kept"] else f' · dropped by {escape(r["dropped_by"] or "?")}: {escape(r["drop_reason"] or "?")}')
        + f'</div><pre>{clip(r["completion"], 600)}</pre>'
        f'<a href="/runs/{seg(run_id)}/rollouts/{seg(r["rollout_id"])}">open</a></div>' for r in items)
    prompt_link = href(f"/prompts/{seg(first['prompt_id'])}", {"runs": run_id})
    body = (f"<p>step {first['step']} · {total} samples · prompt "
            f'<a href="{escape(prompt_link)}">across steps</a></p><pre class="prompt">{clip(first["prompt"], 2000)}</pre>'
            f'<div class="cards">{cards}</div>')
    return page(f"Group {group_id}", body, crumbs=[(run_id, f"/runs/{seg(run_id)}"),
                                                   ("rollouts", f"/runs/{seg(run_id)}/rollouts")])


def prompt_page(ctx: PageContext, prompt_id: str, params: Mapping[str, str]) -> str:
    runs = run_list(params)
    if not runs:
        raise UiError(400, "bad parameter: runs= must name at least one run (runs=A,B)")
    for run_id in runs:
        ctx.run(run_id)
    limit = integer(params, "limit", 400, 1, 5000)
    rows = ctx.browse().prompt_rows(prompt_id, runs, limit).to_pylist()
    if not rows:
        raise UiError(404, f"no rollout of prompt {prompt_id!r} in run(s) {runs}")
    columns: dict[tuple[str, int], list[Row]] = {}
    for r in rows:
        columns.setdefault((r["run_id"], r["step"]), []).append(r)
    cols = "".join(
        f'<div class="col"><div class="head">{escape(run)} · step {step}</div>'
        + "".join(f'<div class="card {"kept" if r["kept"] else "dropped"}"><small>reward {num(r["reward"])}'
                  f' · adv {num(r["advantage"])}{"" if r["kept"] else " · " + escape(r["drop_reason"] or "dropped")}'
                  f'</small><pre>{clip(r["completion"], 300)}</pre></div>' for r in items)
        + "</div>" for (run, step), items in columns.items())
    return page(f"Prompt {prompt_id}", f'<pre class="prompt">{clip(rows[0]["prompt"], 2000)}</pre>'
                f'<div class="across">{cols}</div>')
