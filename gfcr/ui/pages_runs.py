"""The runs list (``/``), a run (``/runs/RUN_ID``) and runs overlaid (``/compare``), with
the fragments the live feed replaces in place (:mod:`gfcr.ui.server` routes them).

Charts are drawn by the page's script (static/ui.js) from ``/api/series``: the same
per-step figures ``gfcr report`` charts (gfcr.report.data.load_run), so the two agree.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from html import escape

import yaml

from gfcr.report.data import ReportError, load_run
from gfcr.report.rows import Row
from gfcr.ui.context import PageContext, UiError
from gfcr.ui.html import clip, href, num, page, pct, seg, status_badge, table, when
from gfcr.ui.params import run_list

SERIES = ("reward_mean", "pass_rate", "train/approx_kl", "train/loss", "train/grad_norm",
          "train/entropy", "step_seconds", "store/kept_share", "store/length_mean",
          "store/truncated_share", "store/sampled_reward", "store/sampled_nll",
          "store/offpolicy_row_share", "store/score_error_share", "heldout_accuracy")
"""The step metrics the run page and the overlay chart (those a run has)."""


def runs_page(ctx: PageContext, params: Mapping[str, str]) -> str:
    body = ('<p><input id="run-filter" placeholder="filter runs (id, pipeline, status)" '
            'size="40"> <button id="overlay" disabled>overlay the picked runs (2-4)</button></p>'
            + runs_table(ctx))
    return page("Runs", body, data={"page": "runs", "store": ctx.uri})


def runs_table(ctx: PageContext) -> str:
    rows = ctx.browse().runs_overview().to_pylist()
    cells = [[f'<input type="checkbox" class="pick" value="{escape(r["run_id"])}">',
              f'<a href="/runs/{seg(r["run_id"])}">{escape(r["run_id"])}</a>', escape(r["pipeline"] or ""),
              status_badge(r["status"]), num(r["steps"]), num(r["rollouts"]), num(r["reward"]),
              pct(r["accuracy"]), num(r["rollouts_per_s"]), when(r["started_at"]),
              clip(r["error"], 80)] for r in rows]
    return table(["", "run", "pipeline", "status", "steps", "rollouts", "reward (last step)",
                  "held-out accuracy", "rollouts/s", "started", "error"], cells,
                 cls="runs", tbody_id="runs-body")


def run_page(ctx: PageContext, run_id: str) -> str:
    run = ctx.run(run_id)
    spec = _spec(run.get("spec_yaml"))
    body = (f'<div id="run-head">{run_head(ctx, run_id)}</div>'
            f"<h2>Pipeline</h2>{_pipeline(spec, run.get('spec_yaml'))}"
            '<h2>Step metrics <small>(click a point: that step\'s rollouts)</small></h2>'
            '<div id="charts" class="charts"></div>'
            f'<h2>Steps</h2><div id="run-steps">{steps_table(ctx, run_id)}</div>'
            f"<h2>Held-out evaluations</h2>{_evaluations(ctx, run_id)}"
            '<h2>Dropped rollouts</h2><div id="drops" class="lazy" '
            f'data-src="/fragment/runs/{seg(run_id)}/drops">reading…</div>'
            '<h2>Warnings and doctor findings</h2><div id="doctor" class="lazy" '
            f'data-src="/fragment/runs/{seg(run_id)}/doctor">reading…</div>')
    marker = ctx.browse().marker(run_id) or {}
    return page(f"Run {run_id}", body, crumbs=[(run_id, f"/runs/{seg(run_id)}")],
                data={"page": "run", "runs": [run_id], "last_step": marker.get("last_step"),
                      "status": marker.get("status"), "series": list(SERIES)})


def run_head(ctx: PageContext, run_id: str) -> str:
    run, marker = ctx.run(run_id), ctx.browse().marker(run_id) or {}
    status = run["status"]
    ended = ""
    if status != "running":
        ended = (f'<p id="run-end" class="end st-{escape(status)}">the run {escape(_ended(status))}'
                 f" at {when(run.get('finished_at'))}"
                 + (f": {escape(str(run['error']))}" if run.get("error") else "") + "</p>")
    items = [("status", f'<span id="run-status">{status_badge(status)}</span>'),
             ("pipeline", escape(run.get("pipeline") or "")),
             ("steps committed", f'<span id="run-nsteps">{num(marker.get("steps"))}</span>'),
             ("last step", f'<span id="run-last">{num(marker.get("last_step"))}</span>'),
             ("started", when(run.get("started_at"))), ("finished", when(run.get("finished_at"))),
             ("rollouts", f'<a href="/runs/{seg(run_id)}/rollouts">browse</a>')]
    return ended + "<dl>" + "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in items) + "</dl>"


def _ended(status: str) -> str:
    return {"finished": "ended", "failed": "failed", "crashed": "crashed (its process died)",
            "cancelled": "was cancelled"}.get(status, f"stopped ({status})")


def steps_table(ctx: PageContext, run_id: str) -> str:
    rows = ctx.reads().steps(run_id).to_pylist()
    cells = []
    for r in reversed(rows):
        m = dict(r["metrics"] or [])
        link = href(f"/runs/{seg(run_id)}/rollouts", {"step": r["step"]})
        cells.append([f'<a href="{escape(link)}">{r["step"]}</a>', num(r["policy_version"]),
                      num(r["n_rollouts"]), num(r["n_kept"]), num(m.get("reward_mean")),
                      num(m.get("pass_rate")), num(m.get("train/approx_kl")),
                      num(m.get("step_seconds")), when(r["committed_at"])])
    return table(["step", "policy version", "rollouts", "kept", "reward", "pass rate",
                  "approx KL", "seconds", "committed"], cells, cls="steps")


def _spec(spec_yaml: str | None) -> dict[str, object]:
    try:
        data = yaml.safe_load(spec_yaml or "")
    except yaml.YAMLError:
        return {}
    return data if isinstance(data, dict) else {}


def _pipeline(spec: dict[str, object], spec_yaml: str | None) -> str:
    def kind(value: object) -> str:
        return escape(str(value.get("type", "?"))) if isinstance(value, dict) else "–"
    parts = [f"<li>{name}: <b>{kind(spec.get(name))}</b></li>"
             for name in ("task", "policy", "engine", "warmstart") if spec.get(name)]
    listed = spec.get("stages")
    stages: list[object] = listed if isinstance(listed, list) else []
    chain = " → ".join(f"<b>{kind(s)}</b>" for s in stages)
    return (f"<ul>{''.join(parts)}<li>stages: {chain or '–'}</li></ul>"
            f"<details><summary>spec (YAML)</summary><pre>{escape(spec_yaml or '')}</pre></details>")


def _evaluations(ctx: PageContext, run_id: str) -> str:
    rows = ctx.reads().evaluations(run_id).to_pylist()
    if not rows:
        return "<p>none yet</p>"
    base = f"/runs/{seg(run_id)}/evaluations"
    first = str(rows[0]["label"] or "")

    def label(r: Row) -> str:  # a link to the prompts this evaluation flipped
        text = str(r["label"] or "")
        if not text or text == first:
            return escape(text)
        return f'<a href="{escape(href(base, {"from": first, "to": text}))}">{escape(text)}</a>'
    return table(["step", "label", "accuracy"],
                 [[num(r["step"]), label(r), pct(r["accuracy"])] for r in rows]) + (
        f'<p><a href="{escape(base)}">which prompts changed</a> (greedy completions, first and '
        "last evaluation)</p>")


def drops_fragment(ctx: PageContext, run_id: str) -> str:
    rows = ctx.browse().drop_reasons(run_id).to_pylist()
    if not rows:
        return "<p>none</p>"
    base = f"/runs/{seg(run_id)}/rollouts"
    return table(["stage", "reason", "rows"], [
        [escape(r["dropped_by"] or "?"),
         f'<a href="{escape(href(base, {"kept": "false", "stage": r["dropped_by"], "reason": r["reason"]}))}">'
         f'{escape(r["reason"])}</a>', num(r["n"])] for r in rows])


def doctor_fragment(ctx: PageContext, run_id: str) -> str:
    """The run's warnings (its error, phase times) and ``gfcr doctor``'s findings."""
    from gfcr.doctor import diagnose

    run = ctx.run(run_id)
    out = [f'<p class="error">the run stopped with: {escape(str(run["error"]))}</p>'] if run.get("error") else []
    out.append(_phase_times(ctx, run_id))
    try:
        findings = diagnose(ctx.store(), run_id)
    except ReportError as e:
        return "".join(out) + f"<p>doctor: {escape(str(e))}</p>"
    if not findings:
        return "".join(out) + "<p>doctor: no finding</p>"
    out += [f'<div class="finding sev-{escape(f.severity)}"><b>{escape(f.severity.upper())} '
            f"{escape(f.check)}</b>: {escape(f.title)}<br><small>evidence: {escape(f.evidence)}<br>"
            f"threshold: {escape(f.threshold)}<br>try: {escape(f.advice)}</small></div>" for f in findings]
    return "".join(out)


def _phase_times(ctx: PageContext, run_id: str) -> str:
    """Seconds per step spent in each stage (``time/*`` metrics) and in the whole step."""
    totals: dict[str, float] = {}
    rows = ctx.reads().steps(run_id).to_pylist()
    for r in rows:
        for name, value in (r["metrics"] or []):
            if (name.startswith("time/") or name == "step_seconds") and value is not None \
                    and math.isfinite(value):
                totals[name] = totals.get(name, 0.0) + value
    if not totals:
        return ""
    cells = [[escape(k), num(v), num(v / len(rows))] for k, v in sorted(totals.items(), key=lambda kv: -kv[1])]
    return "<h3>Phase times</h3>" + table(["phase", "seconds (all steps)", "per step"], cells)


def series(ctx: PageContext, params: Mapping[str, str]) -> dict[str, object]:
    """``/api/series?runs=A,B[&source=steps]``: per run, its steps and the chosen series,
    as ``gfcr report`` reads them (gfcr.report.data.load_run); ``source=steps``: only
    those the ``steps`` table holds (a few rows a run, however many rollouts it has: the
    page's first view, before the per-rollout aggregates arrive)."""
    runs = run_list(params)
    if not 1 <= len(runs) <= 8:
        raise UiError(400, f"bad parameter: runs={params.get('runs', '')!r} must name 1 to 8 runs")
    source = params.get("source", "all")
    if source not in ("all", "steps"):
        raise UiError(400, f"bad parameter: source={source!r} must be all or steps")
    out: dict[str, object] = {}
    for run_id in runs:
        ctx.run(run_id)
        marker = ctx.browse().marker(run_id) or {}
        key = (run_id, source, marker.get("steps"), marker.get("status"))
        if key not in ctx.cache:
            ctx.cache[key] = _series(ctx, run_id, source == "steps")
        out[run_id] = ctx.cache[key]
    return out


def _series(ctx: PageContext, run_id: str, steps_only: bool) -> dict[str, object]:
    if steps_only:
        rows = ctx.reads().steps(run_id).to_pylist()
        steps = [r["step"] for r in rows]
        values = [dict(r["metrics"] or []) for r in rows]
        found = {name: [_float(v.get(name)) for v in values] for name in SERIES}
        found["heldout_accuracy"] = _accuracy_series(steps, [
            (r["step"], float(r["accuracy"]), "") for r in ctx.reads().evaluations(run_id).to_pylist()])
        return {"steps": steps, "series": {k: v for k, v in found.items()
                                           if any(math.isfinite(x) for x in v)}}
    try:
        data = load_run(ctx.store(), run_id, samples=False)
    except ReportError:
        return {"steps": [], "series": {}}
    data.series["heldout_accuracy"] = _accuracy_series(data.steps, data.accuracy)
    return {"steps": data.steps, "series": {k: data.series[k] for k in SERIES if data.has(k)}}


def _float(value: float | None) -> float:
    return math.nan if value is None else float(value)


def _accuracy_series(steps: list[int], accuracy: list[tuple[int, float, str]]) -> list[float]:
    at = {s: a for s, a, _ in accuracy}
    return [at.get(s, math.nan) for s in steps]


def compare_page(ctx: PageContext, params: Mapping[str, str]) -> str:
    runs = run_list(params)
    if not 2 <= len(runs) <= 4:
        raise UiError(400, f"bad parameter: runs={params.get('runs', '')!r}: pick 2 to 4 runs to overlay")
    for run_id in runs:
        ctx.run(run_id)
    links = ", ".join(f'<a href="/runs/{seg(r)}">{escape(r)}</a>' for r in runs)
    return page("Runs overlaid", f"<p>{links}</p><div id=\"charts\" class=\"charts\"></div>",
                data={"page": "compare", "runs": runs, "series": list(SERIES)})
