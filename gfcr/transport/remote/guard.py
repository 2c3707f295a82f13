"""What a pool's worker checks before it runs a call, and where it may write.

A call arrives from Prefect's API, which anyone who reaches it can write to. Before the
worker reads a file the call names or builds anything from its configs, :func:`admit`
requires, in order:

1. the call's signature under the pool's key (:mod:`gfcr.transport.remote.keys`), so only a holder
   of the key (a run of the pool) can make one;
2. that the call has not expired (its ``expires``, the sender's deadline for it) and was
   not run here before (a replay of a signed call is refused by the worker that ran it);
3. that every reference to code by import path in its configs is on the worker's list
   (:mod:`gfcr.config.refs`);
4. that its files are where a run keeps them (:func:`staging`): the input and output
   directly inside ``ROOT/staging/RUN_ID/remote/`` (resolved, links refused), and that
   folder already there (the run makes it; a call that comes after its run ended and
   removed it writes nothing).

A call its run withdrew (an attempt sent again after its worker seemed lost, a call
given up at its deadline) has a ``.withdrawn`` marker beside
its output, or its input file is gone: the worker then runs nothing (:func:`withdrawn`).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

from gfcr.config import refs
from gfcr.transport.remote.call import CallRefused
from gfcr.transport.remote.keys import signed_by

WITHDRAWN = ".withdrawn"
SKEW_S = 120.0
"""Clock difference between run and worker hosts tolerated when a call expires."""

_KEY: list[bytes] = []
_SEEN: OrderedDict[str, str] = OrderedDict()
"""Signatures of the calls run here -> the task run that ran each."""
SEEN = 4096


def hold_key(key: bytes) -> None:
    """This worker's pool key, from now on required on every call."""
    _KEY[:] = [key]


def admit(kind: str, call: Any, mac: str, worker: str, task_run: str = "") -> None:
    """CallRefused unless ``call`` may run here (the module's rules 1 to 4); ``task_run``:
    the task run delivering it (Prefect may deliver one task run twice; another task run
    with the same signed call is a replay)."""
    if not _KEY:
        raise CallRefused(f"engine worker {worker} holds no pool key: it runs no calls")
    if not mac or not signed_by(kind, call, mac, _KEY[0]):
        raise CallRefused(f"engine worker {worker}: the {kind} call {call.name!r} is not signed "
                          "with this pool's key (a run of the pool signs its calls with the "
                          "key file both name); refused without reading it")
    if call.expires is not None and time.time() > call.expires + SKEW_S:
        raise CallRefused(f"engine worker {worker}: the {kind} call {call.name!r} expired at "
                          f"{call.expires:.0f} (its run stopped waiting for it)")
    if _SEEN.get(mac, task_run) != task_run:
        raise CallRefused(f"engine worker {worker}: the {kind} call {call.name!r} ran here "
                          "before (a replayed call)")
    _SEEN[mac] = task_run
    while len(_SEEN) > SEEN:
        _SEEN.popitem(last=False)
    for ref in refs.named_in(call.model_dump(mode="json")):
        refs.check(ref, "code")
    staging(call)


def staging(call: Any) -> Path:
    """The run's staging folder the call's files are in; CallRefused when a file it names
    is elsewhere, a link, or the folder is missing (see the module)."""
    folder = Path(call.out).parent
    if not (folder.name == "remote" and folder.parent.name == call.run_id
            and folder.parent.parent.name == "staging"):
        raise CallRefused(f"call {call.name!r}: its output {call.out!r} is not in a run's "
                          f"staging folder (ROOT/staging/{call.run_id}/remote/)")
    if folder.is_symlink() or not folder.is_dir() or folder.resolve() != folder.absolute():
        raise CallRefused(f"call {call.name!r}: staging folder {str(folder)!r} is missing or "
                          "reached through a link (its run has ended, or the call is not a "
                          "run's)")
    for path in (call.out, call.rows, call.out + ".beat"):
        here = Path(path)
        if here.parent != folder or here.is_symlink() or not here.name.endswith(
                (".parquet", ".beat")) or here.name.startswith("."):
            raise CallRefused(f"call {call.name!r}: {path!r} is not a file of its staging "
                              f"folder {str(folder)!r}")
    return folder


def withdrawn(call: Any) -> bool:
    """Whether the call's run withdrew it (see the module)."""
    return Path(call.out + WITHDRAWN).exists() or not Path(call.rows).exists()
