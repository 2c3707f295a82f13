"""HTTP reads in the tests (``gfcr ui`` pages, servers' endpoints): a status and a body,
an error response's as well as a success's."""

from __future__ import annotations

import urllib.error
import urllib.request


def get(url: str) -> tuple[int, str]:
    """``url``'s status code and decoded body; a 4xx or 5xx answer is returned, not raised
    (``urlopen`` raises it as ``HTTPError``), so a test can assert on it."""
    try:
        with urllib.request.urlopen(url, timeout=60) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
