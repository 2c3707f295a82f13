"""Process checks shared by the tests of processes the run starts (scorer workers, the
lease renewer)."""

from __future__ import annotations


def running(pid: int) -> bool:
    """Whether ``pid`` is alive and not a zombie (from /proc)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
