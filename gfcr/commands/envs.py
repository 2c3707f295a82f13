"""``gfcr envs``: every environment gfcr can run, and how a pipeline names each.

Three kinds (:mod:`gfcr.core.environment`): the environments registered by name
(``register_env``; ``Episodes(env="NAME")``), and what the operator libraries' catalogues
list: TextArena's games (``TextArenaEnv(game=...)``) and the installed verifiers
environments (``VerifiersEnv(module=...)``). ``--json`` prints one JSON object.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from typing import TYPE_CHECKING, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

if TYPE_CHECKING:
    from gfcr.core.environment import EnvEntry


def envs(source: Optional[str] = typer.Argument(
            None, metavar="[SOURCE]", help="Only this source: registered, textarena, verifiers."),
         as_json: bool = typer.Option(False, "--json", help="Print one JSON object.")) -> None:
    """List every environment gfcr can run (registered, TextArena, verifiers) and how to
    use each."""
    from gfcr.core.environment import CATALOGUES

    entries, problems = listing()
    known = ["registered", *sorted(CATALOGUES)]
    if source is not None:
        if source not in known:
            raise typer.BadParameter(f"no source {source!r}; known: {', '.join(known)}",
                                     param_hint="SOURCE")
        entries = [e for e in entries if e.source == source]
        problems = {k: v for k, v in problems.items() if k == source}
    if as_json:
        print(json.dumps({"environments": [asdict(e) for e in entries],
                          "problems": problems}, indent=1))
        return
    console = Console() if sys.stdout.isatty() else Console(width=200)
    table = Table("source", "name", "use", "what", box=None, pad_edge=False)
    for e in entries:
        table.add_row(e.source, escape(e.name), escape(e.usage), escape(e.summary))
    console.print(table)
    for where, problem in problems.items():
        console.print(f"{where}: {escape(problem)}", highlight=False)


def listing() -> tuple[list["EnvEntry"], dict[str, str]]:
    """The entries of every source, and the sources that failed to list (why)."""
    from gfcr.core.environment import CATALOGUES, ENVIRONMENTS, EnvEntry
    from gfcr.core.registry import load_plugins

    load_plugins()
    out = [EnvEntry("registered", name, f'Episodes(env="{name}")', _first_line(factory))
           for name, factory in sorted(ENVIRONMENTS.items())]
    problems: dict[str, str] = {}
    for source, lister in sorted(CATALOGUES.items()):
        try:
            out.extend(lister())
        except Exception as err:  # noqa: BLE001 - one source's failure, reported beside the rest
            problems[source] = f"{type(err).__name__}: {err}"
    return out, problems


def _first_line(obj: object) -> str:
    return ((obj.__doc__ or "").strip().splitlines() or [""])[0]

