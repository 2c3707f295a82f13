"""``gfcr replay what-if``: re-filter a stored run's rollouts and report what would change.

The command's body; the work is the ``what-if`` tool (entry point group ``gfcr.tools``,
stages.replay.whatif), which reads the store read-only and generates nothing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NoReturn, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table


err = Console(stderr=True)
out = Console()
ROOT_HELP = "Run root: the store, MLflow database, caches (default .gfcr)."


app = typer.Typer(no_args_is_help=True, help="Replay stored rollouts without generating.")


FILTER_HELP = ("A filter stage: 'type=NAME[,field=value...]', a YAML mapping "
               "('{type: verify, scorer: exact}') or a .yaml file. Repeat for a chain.")


@app.command("what-if")
def what_if(
    run_id: str = typer.Argument(..., help="Run whose stored rollouts to re-filter."),
    filters: list[str] = typer.Option(..., "--filter", help=FILTER_HELP),
    base: str = typer.Option("kept", help="kept: after the run's own filters; all: these alone."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as one JSON object."),
    root: Path = typer.Option(Path(".gfcr"), help=ROOT_HELP),
    store: Optional[str] = typer.Option(None, help="Store folder or URI (default ROOT/store)."),
) -> None:
    """Re-score or re-filter a past run's rollouts and report how the kept set and rewards
    would change (nothing is generated, nothing is written)."""
    from importlib.metadata import entry_points

    from gfcr.core.storage import backend

    lake = backend()
    stages = [_filter_stage(text) for text in filters]
    tools = {ep.name: ep for ep in entry_points(group="gfcr.tools")}
    if "what-if" not in tools:
        _fail("no 'what-if' tool is installed (entry point group 'gfcr.tools'); "
              "reinstall gfcr (pip install -e .)")
    try:
        with lake.open(store or root / "store", read_only=True, create=False) as s:
            report = tools["what-if"].load()(s, run_id, stages, base=base)
    except lake.errors + (ValueError,) as e:
        _fail(str(e))
    if as_json:
        print(json.dumps(report.as_dict(), default=str))
        return
    _print_what_if(report)


def _filter_stage(text: str) -> Any:
    """A filter stage config from ``--filter`` text, through the stage registry."""
    from pydantic import ValidationError

    from gfcr.config import yamlfile
    from gfcr.core.registry import lookup

    path = Path(text)
    try:
        if path.suffix in (".yaml", ".yml") and path.is_file():
            data = yamlfile.read(path)
        elif "=" in text and not text.lstrip().startswith("{"):
            pairs = [part.partition("=") for part in text.split(",")]
            data = {k.strip(): yamlfile.load(v, where=k) if v else "" for k, _, v in pairs}
        else:
            data = yamlfile.load(text, where="--filter")
    except yamlfile.YamlRefused as e:
        _fail(f"--filter {text!r} is not valid YAML: {e}")
    if not isinstance(data, dict) or "type" not in data:
        _fail(f"--filter {text!r} must name a filter stage with a 'type', e.g. type=dynamic_sampling")
    try:
        return lookup("filter", str(data["type"])).model_validate(data)
    except KeyError as e:
        _fail(f"--filter {text!r}: {e.args[0]}")
    except ValidationError as e:
        problems = "; ".join(f"field {'.'.join(map(str, x['loc']))!r}: {x['msg']}" for x in e.errors())
        _fail(f"--filter {text!r}: {problems}")


def _print_what_if(report: Any) -> None:
    t = report.totals
    nan = float("nan")

    def change(key: str) -> str:
        return f"{t.get(key + '_before', nan):.3f} -> {t.get(key + '_after', nan):.3f}"
    view = Table(title=f"what-if {' -> '.join(report.stages)} on run {report.run_id} "
                       f"(base={report.base})", show_header=False)
    view.add_row("rows (complete, original)", f"{t['rows']:.0f}")
    view.add_row("kept", f"{t['kept_before']:.0f} -> {t['kept_after']:.0f} "
                         f"(-{t['newly_dropped']:.0f} +{t['newly_kept']:.0f})")
    view.add_row("kept groups", f"{t['groups_before']:.0f} -> {t['groups_after']:.0f}")
    view.add_row("rewards changed", f"{t['rewards_changed']:.0f}")
    view.add_row("reward mean", change("reward"))
    view.add_row("kept reward mean", change("kept_reward"))
    for reason, count in sorted(report.reasons.items()):
        view.add_row(f"newly dropped by {reason}", str(count))
    out.print(view)
    steps = Table("step", "kept before", "kept after", "reward before", "reward after")
    for e in report.steps:
        steps.add_row(f"{e['step']:.0f}", f"{e['kept_before']:.0f}", f"{e['kept_after']:.0f}",
                      f"{e.get('reward_before', nan):.3f}", f"{e.get('reward_after', nan):.3f}")
    out.print(steps)


def _fail(message: str) -> NoReturn:
    err.print(f"[red]error:[/red] {escape(message)}", markup=True, highlight=False,
              soft_wrap=True)
    raise typer.Exit(2)
