"""Library warnings of ``gfcr run`` (FutureWarning and DeprecationWarning lines from
transformers, torch, Prefect) written to a log file rather than the terminal, where they
buried gfcr's own progress and summary (over a hundred lines in a default run).

Python's ``warnings`` are routed to the ``py.warnings`` logger (``logging.captureWarnings``)
and that logger writes only to the file; the summary says how many there were and where.
Warnings printed by child processes (a vLLM server) stay in their own output.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class _Sink(logging.Handler):
    """Counts the warnings and appends each to the file, made on the first one (a root
    that cannot be written loses the lines, never the run: the run itself reports why)."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path
        self.n = 0
        self.setFormatter(logging.Formatter("%(asctime)s %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        self.n += 1
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a", encoding="utf-8") as f:
                f.write(self.format(record) + "\n")
        except OSError:
            pass


class WarningsLog:
    """Where the library warnings of a run went and how many there were."""

    def __init__(self, path: Path):
        self.path = path
        self.sink = _Sink(path)

    @property
    def count(self) -> int:
        return self.sink.n

    def note(self) -> str | None:
        """One line for the terminal, or None when there was no warning."""
        if not self.count:
            return None
        return f"{self.count} library warning(s) (FutureWarning etc.) were written to {self.path}"


@contextmanager
def warnings_to_log(path: Path) -> Iterator[WarningsLog]:
    """Send Python warnings to the file ``path`` (created on the first one) while the block
    runs; the terminal gets none of them."""
    log = WarningsLog(path)
    logger = logging.getLogger("py.warnings")
    saved = (logger.handlers[:], logger.propagate)
    logger.handlers = [log.sink]
    logger.propagate = False
    logging.captureWarnings(True)
    try:
        yield log
    finally:
        logging.captureWarnings(False)
        logger.handlers, logger.propagate = saved
