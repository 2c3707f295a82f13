"""``gfcr run`` exits non-zero whenever its run did not finish.

Code a run calls (a user scorer, a stage) can end the process itself: ``sys.exit(0)``
raises SystemExit, which ``gfcr run`` reports as a failure (RunExited), and
``os._exit(0)`` ends the process at once, skipping every handler, with status 0: a
script or scheduler would read a dead run as a finished one. While a run is under way,
:func:`unfinished_exits_fail` makes ``os._exit`` (and ``posix._exit``, the same function)
of the process that started it turn a status of 0 into :data:`UNFINISHED`, saying so on
stderr; forked children keep their own status. Code that reaches the C library's
``_exit`` directly (ctypes) is not covered: the store still shows such a run as crashed
(its lease has no live holder) and ``--resume`` continues it.
"""

from __future__ import annotations

import os
import posix
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn

class RunExited(RuntimeError):
    """Code the run called raised SystemExit: the run did not finish."""


UNFINISHED = 70
"""The exit status of a run that something ended with ``os._exit(0)`` (EX_SOFTWARE)."""


@contextmanager
def unfinished_exits_fail() -> Iterator[None]:
    """While the block runs, ``os._exit(0)`` in this process exits with UNFINISHED."""
    real = os._exit
    owner = os.getpid()

    def _exit(status: int) -> NoReturn:
        if status == 0 and os.getpid() == owner:
            try:
                sys.stderr.write("error: the run did not finish: code it ran called "
                                 f"os._exit(0); exiting with status {UNFINISHED}\n")
                sys.stderr.flush()
            finally:
                real(UNFINISHED)
        real(status)
        raise AssertionError("unreachable")

    os._exit = posix._exit = _exit
    try:
        yield
    finally:
        os._exit = posix._exit = real
