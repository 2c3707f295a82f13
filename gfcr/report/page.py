"""The report page: one self-contained HTML file (inline CSS and SVG, no JavaScript).

Sections: headline numbers, charts over steps (one line per run where runs are compared;
stacked drops and stage times and the pass-rate heatmap per run), the spec as a table
(fields that differ between runs marked), and sampled completions. A Content-Security-
Policy forbids every fetch, so the page provably works offline.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime, timezone
from html import escape

import yaml

from gfcr.report import chat, svg
from gfcr.report.data import PASS_LABELS, RunData
from gfcr.report.decode import run_decoder, safe
from gfcr.report.headline import headline

CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222;max-width:1500px}
h1{font-size:22px} h2{font-size:17px;margin-top:28px;border-bottom:1px solid #ddd}
.grid{display:flex;flex-wrap:wrap;gap:10px}
svg.plot{background:#fff;border:1px solid #e3e3e3;border-radius:4px}
svg text{font:10px system-ui,sans-serif;fill:#333} svg .title{font-size:12px;font-weight:600}
svg .label{fill:#666} svg .empty{fill:#999;font-size:12px}
svg .axis{stroke:#666} svg .grid{stroke:#eee}
table{border-collapse:collapse;margin:6px 0} td,th{border:1px solid #ddd;padding:3px 7px;
vertical-align:top;text-align:left} th{background:#f5f5f5}
td.num{text-align:right;font-variant-numeric:tabular-nums}
tr.diff td{background:#fff6d6} pre{margin:0;white-space:pre-wrap;max-width:520px;font-size:12px}
.right{color:#1a7f37} .wrong{color:#b42318} .dropped{color:#777} small{color:#666}
"""

CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"


def render(runs: Sequence[RunData], *, store: str) -> str:
    """The whole page for ``runs`` (one, or several to compare)."""
    ids = ", ".join(r.run_id for r in runs)
    sections = [_headline(runs), _charts(runs), _per_run_charts(runs), _spec(runs),
                _samples(runs), _chats(runs)]
    made = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
            f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
            f"<title>gfcr report: {escape(ids)}</title><style>{CSS}{chat.CSS}</style></head><body>"
            f"<h1>gfcr report: {escape(ids)}</h1><p><small>store {escape(store)}; made {made} "
            f"by gfcr report from the store alone</small></p>{''.join(sections)}</body></html>")


def _headline(runs: Sequence[RunData]) -> str:
    rows = [headline(r) for r in runs]
    head = "".join(f"<th>{escape(r.run_id)}</th>" for r in runs)
    body = "".join(f"<tr><th>{escape(k)}</th>" + "".join(f'<td class="num">{escape(str(row[k]))}</td>'
                                                         for row in rows) + "</tr>" for k in rows[0])
    return f"<h2>Headline</h2><table><tr><th></th>{head}</tr>{body}</table>"


CHARTS: tuple[tuple[str, str, tuple[float | None, float | None]], ...] = (
    ("sampled reward (fresh rows)", "store/sampled_reward", (None, None)),
    ("sampled pass rate (reward ≥ 1)", "store/sampled_pass_rate", (0.0, 1.0)),
    ("kept share of rows", "store/kept_share", (0.0, 1.0)),
    ("completion length, mean (tokens)", "store/length_mean", (0.0, None)),
    ("completion length, p95 (tokens)", "store/length_p95", (0.0, None)),
    ("truncated share (finish_reason = length)", "store/truncated_share", (0.0, 1.0)),
    ("sampled-token NLL (entropy estimate, nats)", "store/sampled_nll", (0.0, None)),
    ("entropy (learner, nats)", "train/entropy", (0.0, None)),
    ("KL to reference (learner)", "train/kl_ref", (0.0, None)),
    ("approx KL old→new (learner)", "train/approx_kl", (0.0, None)),
    ("clip fraction", "train/clip_frac", (0.0, None)),
    ("grad norm (before clipping)", "train/grad_norm", (0.0, None)),
    ("off-policy share of kept rows", "store/offpolicy_row_share", (0.0, 1.0)),
    ("staleness of off-policy rows (versions)", "store/staleness_mean", (0.0, None)),
    ("IS weight mean (learner)", "train/is_weight_mean", (0.0, None)),
    ("truncated-IS share (learner)", "train/is_truncated_share", (0.0, 1.0)),
    ("score errors share", "store/score_error_share", (0.0, 1.0)),
    ("tool-call rate (episodes with a call)", "tool/call_rate", (0.0, 1.0)),
    ("tool-error rate (failed calls)", "tool/error_rate", (0.0, 1.0)),
    ("episode success (tool runs)", "tool/success", (0.0, 1.0)),
    ("step seconds", "step_seconds", (0.0, None)),
)
"""(title, series, y range) of the charts drawn with one line per run. The learner's
charts are left out when no run logged them."""

OPTIONAL = {"train/entropy", "train/kl_ref", "train/approx_kl", "train/clip_frac", "train/grad_norm",
            "train/is_weight_mean", "train/is_truncated_share", "store/staleness_mean",
            "tool/call_rate", "tool/error_rate", "tool/success"}


def _charts(runs: Sequence[RunData]) -> str:
    figures = [_accuracy_chart(runs)]
    for title, name, (lo, hi) in CHARTS:
        if name in OPTIONAL and not any(r.has(name) for r in runs):
            continue
        series = {r.run_id: ([float(s) for s in r.steps], r.get(name)) for r in runs}
        figures.append(svg.lines(title, series, y_min=lo, y_max=hi))
    return f'<h2>Over steps</h2><div class="grid">{"".join(figures)}</div>'


def _accuracy_chart(runs: Sequence[RunData]) -> str:
    series = {r.run_id: ([float(s) for s, _, _ in r.accuracy], [a for _, a, _ in r.accuracy])
              for r in runs}
    if not any(xs for xs, _ in series.values()):
        return svg.empty("held-out accuracy", "no held-out evaluation in the store")
    return svg.lines("held-out accuracy", series, y_min=0.0, y_max=1.0)


def _per_run_charts(runs: Sequence[RunData]) -> str:
    out = []
    for r in runs:
        times = {k.removeprefix("time/"): v for k, v in r.series.items() if k.startswith("time/")}
        figures = [svg.stacked("dropped rows by stage: reason", r.steps, r.drops),
                   svg.stacked("time per stage per step (s)", r.steps, times, unit=" s"),
                   svg.heatmap("group pass-rate distribution (share of groups)", r.steps,
                               PASS_LABELS, r.pass_dist)]
        out.append(f"<h2>{escape(r.run_id)}: drops, stage time, pass rates</h2>"
                   f'<div class="grid">{"".join(figures)}</div>')
    return "".join(out)


def _spec(runs: Sequence[RunData]) -> str:
    from gfcr.tracking.mlflow_hook import flatten  # the keys MLflow logs the spec under

    specs = [flatten(yaml.safe_load(r.run["spec_yaml"]) or {}) for r in runs]
    keys = list(dict.fromkeys(k for s in specs for k in s))
    head = "".join(f"<th>{escape(r.run_id)}</th>" for r in runs)
    rows = []
    for k in keys:
        values = [s.get(k, "") for s in specs]
        cls = ' class="diff"' if len(set(values)) > 1 else ""
        rows.append(f"<tr{cls}><th>{escape(k)}</th>" + "".join(f"<td>{escape(v)}</td>" for v in values) + "</tr>")
    hashes = ", ".join(f"{escape(r.run_id)}: {escape(r.run['spec_hash'])}" for r in runs)
    note = " (rows that differ are marked)" if len(runs) > 1 else ""
    return (f"<h2>Spec</h2><p><small>spec hash {hashes}{note}</small></p>"
            f"<table><tr><th>field</th>{head}</tr>{''.join(rows)}</table>")


def _samples(runs: Sequence[RunData]) -> str:
    out = ["<h2>Sampled completions (right, wrong, dropped)</h2>"]
    for r in runs:
        rows = "".join(
            f'<tr><td class="num">{s["step"]}</td><td class="{escape(s["kind"])}">{escape(s["kind"])}</td>'
            f"<td><pre>{escape(_clip(s['prompt']))}</pre></td><td><pre>{escape(_clip(s['completion']))}</pre></td>"
            f"<td>{escape(str(s['answer']))}</td><td class=\"num\">{_num(s['reward'])}</td>"
            f"<td>{escape(str(s['finish_reason']))}</td>"
            f"<td>{escape(' / '.join(x for x in (s['dropped_by'], s['drop_reason']) if x))}</td></tr>"
            for s in r.samples)
        out.append(f"<h3>{escape(r.run_id)}</h3><table><tr><th>step</th><th>kind</th><th>prompt</th>"
                   f"<th>completion</th><th>answer</th><th>reward</th><th>finish</th><th>dropped</th></tr>"
                   f"{rows}</table>")
    return "".join(out)


def _chats(runs: Sequence[RunData]) -> str:
    if not any(r.chats for r in runs):
        return ""
    out = ["<h2>Sample trajectories (one bubble per turn; struck through: out of the loss)</h2>"]
    for r in runs:
        decode = safe(run_decoder(r.run.get("spec_yaml")))
        out.append(f"<h3>{escape(r.run_id)}</h3>{chat.render_chats(r.chats, decode)}")
    return "".join(out)


def _clip(text: str, n: int = 400) -> str:
    return text if len(text) <= n else text[:n] + " …"


def _num(v: float | None) -> str:
    return "–" if v is None else f"{v:.3g}"
