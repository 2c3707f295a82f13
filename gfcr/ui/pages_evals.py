"""Which held-out prompts a run flipped (``/runs/RUN_ID/evaluations?set=&from=&to=&flipped=``):
the greedy completion of every prompt of an evaluation set at two of the run's
evaluations side by side, the prompts that changed from wrong to right (fixed) or right to
wrong (broken) first. Read from the store's ``eval_completions`` (schema version 3); an
older store keeps accuracies only, and the page says so."""

from __future__ import annotations

import re
from collections.abc import Mapping
from html import escape

from gfcr.ui.context import PageContext, UiError
from gfcr.ui.html import clip, href, num, page, seg, table
from gfcr.report.rows import Row

_CHANGE = {(False, True): "fixed", (True, False): "broken"}


def label_order(label: str) -> tuple[int, str]:
    """Evaluations in the order a run makes them: ``initial``, then ``step=N`` by N."""
    found = re.fullmatch(r"step=(\d+)", label)
    return (-1, label) if found is None else (int(found.group(1)), "")


def evaluations_page(ctx: PageContext, run_id: str, params: Mapping[str, str]) -> str:
    ctx.run(run_id)
    eval_set = params.get("set", "heldout")
    rows = ctx.browse().eval_completions(run_id, eval_set, []).to_pylist()
    labels = sorted({r["label"] for r in rows}, key=label_order)
    base = f"/runs/{seg(run_id)}/evaluations"
    crumbs = [(run_id, f"/runs/{seg(run_id)}"), ("evaluations", base)]
    if not labels:
        return page(f"Evaluations of {run_id}", f"<p>no completions stored for evaluation set "
                    f"{escape(eval_set)!s} (a store written before schema version 3 keeps accuracies "
                    "only)</p>", crumbs=crumbs)
    first, last = (params.get("from", labels[0]), params.get("to", labels[-1]))
    for name, value in (("from", first), ("to", last)):
        if value not in labels:
            raise UiError(400, f"bad parameter: {name}={value!r} is not an evaluation of this run "
                               f"on {eval_set!r} (it has {', '.join(labels)})")
    pairs = _pairs(rows, first, last)
    only = params.get("flipped") in ("1", "true")
    shown = [p for p in pairs if not only or p["change"]]
    body = (_choices(base, eval_set, labels, first, last, only) + _summary(pairs, first, last)
            + _table(shown, first, last))
    return page(f"Evaluations of {run_id}: {first} → {last}", body, crumbs=crumbs,
                data={"page": "evaluations", "runs": [run_id]})


def _pairs(rows: list[Row], first: str, last: str) -> list[Row]:
    """One entry per prompt evaluated at both labels, changed ones first."""
    by: dict[str, Row] = {}
    for r in rows:
        if r["label"] in (first, last):
            by.setdefault(r["prompt_id"], {})[r["label"]] = r
    out = []
    for prompt_id, seen in by.items():
        if first in seen and last in seen:
            a, b = seen[first], seen[last]
            out.append({"prompt_id": prompt_id, "before": a, "after": b,
                        "change": _CHANGE.get((bool(a["correct"]), bool(b["correct"])))})
    return sorted(out, key=lambda p: (p["change"] is None, p["change"] or "", p["prompt_id"]))


def _choices(base: str, eval_set: str, labels: list[str], first: str, last: str, only: bool) -> str:
    def link(text: str, **change: str) -> str:
        params = {"set": eval_set, "from": first, "to": last, **({"flipped": "1"} if only else {})}
        params.update(change)
        return f'<a href="{escape(href(base, {k: v for k, v in params.items() if v}))}">{escape(text)}</a>'
    froms = " ".join(f"<b>{escape(x)}</b>" if x == first else link(x, **{"from": x}) for x in labels)
    tos = " ".join(f"<b>{escape(x)}</b>" if x == last else link(x, to=x) for x in labels)
    toggle = link("all prompts", flipped="") if only else link("flipped only", flipped="1")
    return f'<p class="choices">from: {froms}<br>to: {tos}<br>{toggle}</p>'


def _summary(pairs: list[Row], first: str, last: str) -> str:
    before = sum(bool(p["before"]["correct"]) for p in pairs)
    after = sum(bool(p["after"]["correct"]) for p in pairs)
    fixed = sum(p["change"] == "fixed" for p in pairs)
    broken = sum(p["change"] == "broken" for p in pairs)
    return (f'<p id="eval-summary">{len(pairs)} prompts · correct at {escape(first)}: {before} · '
            f"at {escape(last)}: {after} · <b>{fixed} fixed</b>, <b>{broken} broken</b></p>")


def _table(pairs: list[Row], first: str, last: str) -> str:
    def cell(r: Row) -> str:
        mark = "✓" if r["correct"] else "✗"
        error = f'<div class="dropped">{escape(r["error"])}</div>' if r.get("error") else ""
        return f"{mark} {num(r['reward'])}<pre>{clip(r['completion'], 400)}</pre>{error}"
    return table(["change", "prompt", "answer", escape(first), escape(last)], [
        [escape(p["change"] or ""), f"<pre>{clip(p['before']['prompt'], 400)}</pre>",
         clip(p["before"]["answer"], 80), cell(p["before"]), cell(p["after"])] for p in pairs],
        cls="evals", tbody_id="eval-rows")
