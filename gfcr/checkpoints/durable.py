"""Durable writes: what checkpoints and weight versions flush before they are named
whole (gfcr.checkpoints.checkpoint, gfcr.weights.versions)."""

from __future__ import annotations

import os
from pathlib import Path


def fsync(path: Path) -> None:
    """Flush ``path`` (a file, or a folder's entries) to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
