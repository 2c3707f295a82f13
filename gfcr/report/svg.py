"""Static SVG charts as strings: lines over steps, stacked bars, a heatmap.

No JavaScript and no plotting library, so a report opens offline in any browser and
stays a few hundred kilobytes. Every chart is an ``<svg class="plot">`` whose data marks
carry ``class="data"``; a chart with nothing to draw says so in its text instead, which
is what the browser test looks for. Values that are NaN leave gaps.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from html import escape

W, H = 440, 230
LEFT, RIGHT, TOP, BOTTOM = 52, 12, 26, 58

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22", "#17becf")


def _fmt(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 1000 or abs(value) < 0.01:
        return f"{value:.2g}"
    return f"{value:.3g}"


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About ``n`` round tick values covering [lo, hi]."""
    if hi <= lo:
        return [lo]
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.ceil(lo / step) * step
    return [start + i * step for i in range(int((hi - start) / step + 1e-9) + 1)]


class _Frame:
    """Maps (step, value) into the plot area and draws axes."""

    def __init__(self, x0: float, x1: float, y0: float, y1: float) -> None:
        if x1 <= x0:
            x0, x1 = x0 - 0.5, x1 + 0.5
        if y1 <= y0:
            y1 = y0 + (abs(y0) * 0.2 or 1.0)
        self.x0, self.x1, self.y0, self.y1 = x0, x1, y0, y1

    def x(self, v: float) -> float:
        return LEFT + (v - self.x0) / (self.x1 - self.x0) * (W - LEFT - RIGHT)

    def y(self, v: float) -> float:
        return H - BOTTOM - (v - self.y0) / (self.y1 - self.y0) * (H - TOP - BOTTOM)

    def axes(self, x_label: str = "step") -> str:
        parts = [f'<line x1="{LEFT}" y1="{H - BOTTOM}" x2="{W - RIGHT}" y2="{H - BOTTOM}" class="axis"/>',
                 f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{H - BOTTOM}" class="axis"/>']
        for t in _ticks(self.y0, self.y1):
            y = self.y(t)
            parts.append(f'<line x1="{LEFT}" y1="{y:.1f}" x2="{W - RIGHT}" y2="{y:.1f}" class="grid"/>'
                         f'<text x="{LEFT - 4}" y="{y + 3:.1f}" text-anchor="end">{_fmt(t)}</text>')
        for t in _ticks(self.x0, self.x1, 6):
            if float(t).is_integer() or self.x1 - self.x0 < 6:
                x = self.x(t)
                parts.append(f'<text x="{x:.1f}" y="{H - BOTTOM + 13}" text-anchor="middle">{_fmt(t)}</text>')
        parts.append(f'<text x="{(LEFT + W - RIGHT) / 2}" y="{H - BOTTOM + 26}" '
                     f'text-anchor="middle" class="label">{escape(x_label)}</text>')
        return "".join(parts)


def _svg(title: str, body: str, legend: Sequence[tuple[str, str]] = ()) -> str:
    items = []
    for i, (name, color) in enumerate(legend[:10]):
        x, y = LEFT - 40 + (i % 2) * 220, H - 18 + (i // 2) * 12
        items.append(f'<rect x="{x}" y="{y - 7}" width="9" height="9" fill="{color}"/>'
                     f'<text x="{x + 12}" y="{y + 1}">{escape(name[:40])}</text>')
    if len(legend) > 10:
        items.append(f'<text x="{W - RIGHT}" y="{H - 2}" text-anchor="end">+{len(legend) - 10} more</text>')
    height = H + 12 * max(0, (min(len(legend), 10) - 1) // 2 - 1)
    return (f'<svg class="plot" xmlns="http://www.w3.org/2000/svg" width="{W}" height="{height}" '
            f'viewBox="0 0 {W} {height}" role="img"><title>{escape(title)}</title>'
            f'<text x="{LEFT}" y="16" class="title">{escape(title)}</text>{body}{"".join(items)}</svg>')


def empty(title: str, why: str) -> str:
    """A chart placeholder that says why there is nothing to draw."""
    return _svg(title, f'<text x="{W / 2}" y="{H / 2}" text-anchor="middle" class="empty">'
                       f'{escape(why)}</text>')


def lines(title: str, series: Mapping[str, tuple[Sequence[float], Sequence[float]]], *,
          y_min: float | None = None, y_max: float | None = None, x_label: str = "step") -> str:
    """One polyline (and dots) per named series of (x values, y values); NaN is a gap."""
    finite = {k: [(x, y) for x, y in zip(*xy) if math.isfinite(y)] for k, xy in series.items()}
    finite = {k: v for k, v in finite.items() if v}
    if not finite:
        return empty(title, "not logged by this run")
    xs = [p[0] for v in finite.values() for p in v]
    ys = [p[1] for v in finite.values() for p in v]
    frame = _Frame(min(xs), max(xs), min(ys) if y_min is None else min(y_min, min(ys)),
                   max(ys) if y_max is None else max(y_max, max(ys)))
    body, legend = [frame.axes(x_label)], []
    for i, (name, (xs_, ys_)) in enumerate(series.items()):
        if name not in finite:
            continue
        color = PALETTE[i % len(PALETTE)]
        legend.append((name, color))
        for run in _runs(xs_, ys_):
            points = " ".join(f"{frame.x(x):.1f},{frame.y(y):.1f}" for x, y in run)
            body.append(f'<polyline class="data" fill="none" stroke="{color}" stroke-width="1.6" '
                        f'points="{points}"><title>{escape(name)}</title></polyline>')
        if len(finite[name]) <= 60:
            body += [f'<circle class="data" cx="{frame.x(x):.1f}" cy="{frame.y(y):.1f}" r="2" '
                     f'fill="{color}"><title>{escape(name)} at {_fmt(x)}: {_fmt(y)}</title></circle>'
                     for x, y in finite[name]]
    return _svg(title, "".join(body), legend if len(series) > 1 else ())


def _runs(xs: Sequence[float], ys: Sequence[float]) -> list[list[tuple[float, float]]]:
    """Consecutive finite points, split at NaN."""
    out: list[list[tuple[float, float]]] = [[]]
    for x, y in zip(xs, ys):
        if math.isfinite(y):
            out[-1].append((x, y))
        elif out[-1]:
            out.append([])
    return [r for r in out if r]


def stacked(title: str, steps: Sequence[int], parts: Mapping[str, Sequence[float]], *,
            unit: str = "") -> str:
    """Stacked bars per step, one colour per part (the rest, past 9 parts, as 'other')."""
    shown = {k: v for k, v in parts.items() if any(math.isfinite(x) and x > 0 for x in v)}
    if not shown or not steps:
        return empty(title, "nothing recorded")
    names = list(shown)
    if len(names) > 9:
        other = [sum(shown[n][i] for n in names[9:]) for i in range(len(steps))]
        shown = {n: shown[n] for n in names[:9]} | {"other": other}
    parts = shown
    totals = [sum(v[i] for v in parts.values() if math.isfinite(v[i])) for i in range(len(steps))]
    frame = _Frame(min(steps) - 0.5, max(steps) + 0.5, 0.0, max(totals) or 1.0)
    width = max(1.0, (frame.x(1) - frame.x(0)) * 0.8)
    body, legend = [frame.axes()], []
    base = [0.0] * len(steps)
    for i, (name, values) in enumerate(parts.items()):
        color = PALETTE[i % len(PALETTE)]
        legend.append((name, color))
        for j, (step, v) in enumerate(zip(steps, values)):
            if not (math.isfinite(v) and v > 0):
                continue
            top, bottom = frame.y(base[j] + v), frame.y(base[j])
            body.append(f'<rect class="data" x="{frame.x(step) - width / 2:.1f}" y="{top:.1f}" '
                        f'width="{width:.1f}" height="{max(bottom - top, 0.5):.1f}" fill="{color}">'
                        f'<title>{escape(name)} at step {step}: {_fmt(v)}{unit}</title></rect>')
            base[j] += v
    return _svg(title, "".join(body), legend)


def heatmap(title: str, steps: Sequence[int], rows: Sequence[str],
            shares: Sequence[Sequence[float]]) -> str:
    """Steps across, ``rows`` (bins) up; each cell's darkness is its share of the step."""
    if not steps or not any(any(s > 0 for s in col) for col in shares):
        return empty(title, "nothing recorded")
    frame = _Frame(min(steps) - 0.5, max(steps) + 0.5, 0.0, float(len(rows)))
    width = frame.x(1) - frame.x(0)
    body = [f'<line x1="{LEFT}" y1="{H - BOTTOM}" x2="{W - RIGHT}" y2="{H - BOTTOM}" class="axis"/>']
    for r, label in enumerate(rows):
        body.append(f'<text x="{LEFT - 4}" y="{frame.y(r + 0.5) + 3:.1f}" text-anchor="end">{escape(label)}</text>')
    for step, column in zip(steps, shares):
        for r, share in enumerate(column):
            if share <= 0:
                continue
            body.append(f'<rect class="data" x="{frame.x(step) - width / 2:.1f}" y="{frame.y(r + 1):.1f}" '
                        f'width="{width + 0.3:.1f}" height="{frame.y(r) - frame.y(r + 1) + 0.3:.1f}" '
                        f'fill="#1f4e9c" fill-opacity="{0.08 + 0.92 * share:.2f}">'
                        f'<title>step {step}, pass rate {escape(rows[r])}: {share:.0%} of groups</title></rect>')
    for t in _ticks(frame.x0, frame.x1, 6):
        if float(t).is_integer():
            body.append(f'<text x="{frame.x(t):.1f}" y="{H - BOTTOM + 13}" text-anchor="middle">{_fmt(t)}</text>')
    body.append(f'<text x="{(LEFT + W - RIGHT) / 2}" y="{H - BOTTOM + 26}" text-anchor="middle" '
                f'class="label">step</text>')
    return _svg(title, "".join(body))
