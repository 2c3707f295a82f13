"""``gfcr ui``: a local web page over a rollout store that follows runs as they train.

Read-only and light: a standard-library HTTP server (:mod:`gfcr.ui.server`) renders pages
from the store's named reads (``StoreBackend.reads`` and ``StoreBackend.browse``: no SQL
here), pushes a running run's new steps and its end to the page with server-sent events,
and serves its own script and style sheet from the package (no CDN, no build step).
Pages: the runs (:mod:`gfcr.ui.pages_runs`), a run's rollouts, groups and a prompt across
steps and runs (:mod:`gfcr.ui.pages_rollouts`), one rollout's turns and tokens
(:mod:`gfcr.ui.pages_rollout`).
"""

from __future__ import annotations

from gfcr.ui.server import UiServer, serve

__all__ = ["UiServer", "serve"]
