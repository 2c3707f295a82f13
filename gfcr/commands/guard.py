"""How ``gfcr`` reports a failure: one short paragraph, no traceback (``--debug``: all).

A user's mistake (a bad pipeline, a task the tokenizer cannot represent, a scorer that
raises on every row) should read as one paragraph naming what was wrong and where; a
traceback through Prefect's task machinery hides that. ``--debug`` anywhere on the command
line shows the traceback and Prefect's own console logs instead.
"""

from __future__ import annotations

import os
import sys
from typing import Callable

from rich.console import Console

DEBUG_FLAG = "--debug"


def guarded(app: Callable[[], object], argv: list[str] | None = None) -> None:
    """Run the typer ``app``; an exception it lets through becomes one paragraph on
    stderr and exit status 1, unless ``--debug`` is given."""
    argv = sys.argv if argv is None else argv
    debug = DEBUG_FLAG in argv[1:]
    if debug:
        argv.remove(DEBUG_FLAG)
        os.environ["GFCR_DEBUG"] = "1"
    try:
        app()
    except Exception as err:  # noqa: BLE001 - every failure gets the same short report
        if debug:
            raise
        Console(stderr=True).print(paragraph(err), markup=False, highlight=False,
                                   soft_wrap=True)
        sys.exit(1)


def debugging() -> bool:
    """Whether this process runs ``gfcr --debug``."""
    return os.environ.get("GFCR_DEBUG") == "1"


def paragraph(err: BaseException) -> str:
    """``error: Type: message`` on one paragraph, with how to see the traceback."""
    text = " ".join(str(err).split()) or repr(err)
    return (f"error: {type(err).__name__}: {text}\n(run the command again with --debug for "
            "the traceback)")
