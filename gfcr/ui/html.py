"""The page frame and small HTML helpers every page of ``gfcr ui`` shares."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from datetime import datetime
from decimal import Decimal
from html import escape
from urllib.parse import quote, urlencode


def page(title: str, body: str, *, crumbs: Iterable[tuple[str, str]] = (),
         data: Mapping[str, object] | None = None) -> str:
    """A whole page: the title, links back (``crumbs``: (label, href)), ``body``, and the
    page's data for the script (``data``, JSON in a script tag of type application/json)."""
    nav = " / ".join([f'<a href="/">runs</a>'] + [f'<a href="{escape(h)}">{escape(t)}</a>'
                                                 for t, h in crumbs])
    blob = (f'<script id="page-data" type="application/json">{json_text(data)}</script>'
            if data is not None else "")
    return ("<!doctype html><html><head><meta charset='utf-8'>"
            f"<title>{escape(title)} · gfcr ui</title>"
            '<link rel="stylesheet" href="/static/ui.css"></head><body>'
            f'<header><span class="brand">gfcr ui</span> <nav>{nav}</nav>'
            '<span id="live" class="live"></span></header>'
            f"<main><h1>{escape(title)}</h1>{body}</main>{blob}"
            '<script src="/static/ui.js"></script></body></html>')


def error_page(status: int, message: str) -> str:
    """The page of a request that could not be answered: what was wrong, no traceback."""
    what = {400: "bad request", 403: "forbidden", 404: "not found", 503: "store unavailable"}
    return page(what.get(status, "error"),
                f'<p class="error" id="error">{escape(message)}</p>'
                '<p><a href="/">back to the runs</a></p>')


def json_text(value: object) -> str:
    """``value`` as JSON safe inside a script tag (NaN as null, dates as text)."""
    return json.dumps(plain(value), separators=(",", ":")).replace("</", "<\\/")


def plain(value: object) -> object:
    """``value`` with what JSON cannot hold made plain: NaN/inf -> None, Decimal ->
    float, datetimes -> ISO text, tuples -> lists."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, datetime):
        return value.isoformat(timespec="seconds")
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def num(value: float | Decimal | None, digits: int = 3) -> str:
    """A number for a table cell: ``–`` for none."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–"
    if isinstance(value, (int, Decimal)) and not isinstance(value, bool):
        return f"{int(value):,}"
    return f"{float(value):.{digits}g}"


def pct(value: float | None) -> str:
    return "–" if value is None else f"{float(value):.1%}"


def when(value: object) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S") if isinstance(value, datetime) else "–"


def href(path: str, params: Mapping[str, object] | None = None) -> str:
    """A link to ``path`` (its segments quoted by the caller with :func:`seg`) with
    ``params`` (None values left out)."""
    kept = {k: v for k, v in (params or {}).items() if v is not None and v != ""}
    return path + (f"?{urlencode(kept)}" if kept else "")


def seg(text: str) -> str:
    """One URL path segment (a run, rollout or group id), quoted."""
    return quote(str(text), safe="")


def table(head: Iterable[str], rows: Iterable[Iterable[str]], *, cls: str = "",
          tbody_id: str = "") -> str:
    """A table of already-escaped cells."""
    th = "".join(f"<th>{escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    ident = f' id="{escape(tbody_id)}"' if tbody_id else ""
    return f'<table class="{escape(cls)}"><thead><tr>{th}</tr></thead><tbody{ident}>{body}</tbody></table>'


def status_badge(status: str | None) -> str:
    s = status or "?"
    return f'<span class="status st-{escape(s)}">{escape(s)}</span>'


def clip(text: object, n: int = 160) -> str:
    s = "" if text is None else str(text)
    return escape(s if len(s) <= n else s[:n] + " …")
