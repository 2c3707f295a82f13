"""User scorers that end the process themselves (issue 26 item 8: `gfcr run` must not
exit 0 when its run did not finish)."""

from __future__ import annotations

import os


def os_exit(completion: str, answer: str | None, meta: str | None) -> float:
    os._exit(0)
