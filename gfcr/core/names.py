"""Names that become folder and file names: pipeline names, stage names, run ids.

A run's checkpoints live under ``ROOT/runs/RUN_ID``, its staged tables under
``ROOT/staging/RUN_ID/STEP/STAGE.arrow``, and a new run id starts with the pipeline's
name. A name holding ``/``, ``..`` or a leading ``/`` would put those files outside the
run root (``--set name=../../x``), or make the run's own clean-up delete another
folder. So every such name is checked once, here, before any work starts: letters,
digits, ``.``, ``_`` and ``-``, starting with a letter or digit; a pipeline or stage name
at most 128 characters, a run id (the pipeline's name plus a time stamp) at most 200.
"""

from __future__ import annotations

import re

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
NAME_LIMIT = 128
RUN_ID_LIMIT = 200


def rule(limit: int = NAME_LIMIT) -> str:
    return (f"may hold only letters, digits, '.', '_' and '-', start with a letter or digit "
            f"and be at most {limit} characters long (it names folders and files under the "
            "run root)")


class UnsafeName(ValueError):
    """A name used as a folder or file name is not safe; the message names it and why."""


def problem(what: str, value: object, limit: int = NAME_LIMIT) -> str | None:
    """None if ``value`` is a safe name, else a sentence naming ``what`` and the rule."""
    if isinstance(value, str) and len(value) <= limit and NAME.fullmatch(value):
        return None
    return f"{what} {value!r} {rule(limit)}"


def check_run_id(run_id: str) -> str:
    """``run_id`` if it is a safe run id; raises ``UnsafeName`` naming it otherwise."""
    message = problem("run id", run_id, RUN_ID_LIMIT)
    if message is not None:
        raise UnsafeName(message)
    return run_id
