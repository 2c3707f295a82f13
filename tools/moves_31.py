"""Issue 31 item 5: the kernel's moves, as a script that can be run again.

Usage: ``python tools/moves_31.py [--rewrite-only] [--check] [--owned]``. Three tables below say what
moved: whole modules (``MODULES``: old dotted name -> new), single names split out of a
module (``NAMES``: (old module, name) -> new module) and classes renamed so that each name
means one thing (``RENAMES``: (module, old name) -> new name). The script

- ``git mv``\\ s each module that is still at its old path (skipped with ``--rewrite-only``);
- rewrites every tracked or new file of the tree (``*.py``, ``*.md``, ``*.toml``,
  ``*.yaml``, ``*.txt``, ``.ci/run``): dotted names (``gfcr.core.yamlfile``), paths
  (``gfcr/core/yamlfile.py``, ``core/yamlfile.py``), ``from PACKAGE import module`` lists,
  ``from MODULE import name`` lists of split-out names (split into two statements), and
  renamed classes in their module and in every file that imports them from it.

Every rewrite maps old to new only, so a second run changes nothing, and a branch merged
later with imports of the old paths is brought over by running it again
(``--rewrite-only`` once the files have moved). ``--check`` changes nothing and exits 1
when a file still needs a rewrite; ``--owned`` adds the renames of :data:`OWNED_RENAMES`.
The code split out of a module (``NAMES``) was moved by hand once.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SUFFIXES = {".py", ".md", ".toml", ".yaml", ".yml", ".txt"}
EXTRA_FILES = {".ci/run"}

MODULES: dict[str, str] = {
    # what a user writes, read and checked: below gfcr.core, which imports it
    "gfcr.core.yamlfile": "gfcr.config.yamlfile",
    "gfcr.core.overrides": "gfcr.config.overrides",
    "gfcr.core.problems": "gfcr.config.problems",
    "gfcr.core.refs": "gfcr.config.refs",
    # experiment trackers
    "gfcr.runner.tracking": "gfcr.tracking.mlflow_hook",
    "gfcr.runner.trackers": "gfcr.tracking.trackers",
    # a run's state at a step boundary: written, continued, stopped at, exported
    "gfcr.runner.checkpoint": "gfcr.checkpoints.checkpoint",
    "gfcr.runner.resume": "gfcr.checkpoints.resume",
    "gfcr.runner.cancel": "gfcr.checkpoints.cancel",
    "gfcr.runner.export": "gfcr.checkpoints.export",
    "gfcr.runner.durable": "gfcr.checkpoints.durable",
    # the weight versions a learner publishes to other processes, and their checked loads
    "gfcr.runner.weights": "gfcr.weights.versions",
    "gfcr.runner.published": "gfcr.weights.published",
    # held-out evaluation and its stored columns
    "gfcr.runner.evaluation": "gfcr.evaluation.heldout",
    "gfcr.core.evaluations": "gfcr.evaluation.columns",
    # where a step's tables wait between (Prefect) task calls
    "gfcr.runner.stash": "gfcr.transport.stash",
    # a policy's chat template applied in token space, and its guard against content that
    # forges turns: an implementation of gfcr.core.trajectory.ChatFormat, not a contract
    "gfcr.core.chat": "gfcr.chat.formats",
    "gfcr.core.chattext": "gfcr.chat.specials",
    # a task's prompts checked against the policy's tokenizer when a run is built
    "gfcr.runner.tokencheck": "gfcr.launch.tokencheck",
}
"""old dotted module -> new dotted module (the file moves with it)."""

NAMES: dict[tuple[str, str], str] = {
    # stage.py at the cap: the registry is its own module
    **{("gfcr.core.stage", n): "gfcr.core.registry"
       for n in ("COMPONENT_METHODS", "REGISTRY", "register", "lookup", "load_plugins")},
    # engine.py near the cap: the policy and its tensor I/O are not the engine protocol
    ("gfcr.core.engine", "Policy"): "gfcr.core.policy",
    ("gfcr.core.engine", "TensorIO"): "gfcr.core.policy",
    # stages/engines/hf.py near the cap: its logprob arithmetic
    ("stages.engines.hf", "token_logprobs"): "stages.engines.hf_sampling",
    ("stages.engines.hf", "batch_token_logprobs"): "stages.engines.hf_sampling",
    # stages/advantages.py near the cap: the rewards column as an array is not an estimator
    ("stages.advantages", "reward_components"): "stages.reward_components",
    # the contract a trajectory renders through stays in the kernel (gfcr.core.chat moved)
    ("gfcr.core.chat", "ChatFormat"): "gfcr.core.trajectory",
    # one name, one place: rollout.py re-exported the turn schema and its derivations
    **{("gfcr.core.rollout", n): "gfcr.core.trajectory"
       for n in ("BRANCH_TYPE", "TURN_SOURCES", "TURN_TYPE", "TURNS_TYPE", "loss_mask")},
    **{("gfcr.core.rollout", n): "gfcr.core.turncols"
       for n in ("flat_columns", "single_turns")},
}
"""(old module, name) -> the module that now defines the name."""

RENAMES: dict[tuple[str, str], str] = {
    # the store's implementations of gfcr.core's protocols
    ("store.history", "History"): "LakeHistory",
    ("store.reads", "RunReads"): "LakeRunReads",
    ("store.browse", "BrowseReads"): "LakeBrowseReads",
    # one name, one thing (review 1.4): the other class of each name keeps it
    ("stages.generate._calls", "Outcome"): "CallOutcome",
    ("stages.envs.tools", "Call"): "ToolCall",
    ("gfcr.ui.context", "Context"): "PageContext",
    # the train stage's learner (what ``Train.learner`` builds); gfcr.core.services.Learner
    # is the run's learner service, which owns the weights and wraps it
    ("gfcr.core.stage", "Learner"): "StageLearner",
    # the sharded learner's side in gfcr; stages.train keeps Rank (an FSDP2 rank worker)
    # and Ranks (the learner's processes as an update sees them)
    ("gfcr.transport.sharded_rank", "Rank"): "RankServer",
    ("gfcr.transport.sharded_ranks", "Ranks"): "RankProcesses",
    # an engine worker refusing a call; gfcr.procs.wire.Refused: a peer without the key
    ("gfcr.transport.remote.call", "Refused"): "CallRefused",
    # the scorer's child processes; gfcr.transport.remote.pool.WorkerPool: a Prefect pool
    ("gfcr.procs.scorer_workers", "WorkerPool"): "ScorerWorkers",
}
"""(module that defines it, after the moves; old class name) -> new class name."""

OWNED_RENAMES: dict[tuple[str, str], str] = {
    # in files other branches of issue 31 rewrite: applied only with --owned, by the lead
    # after merging them (check the diff: every bare use of the old name in a file that
    # imports it is renamed, prose included). Empty: the stage's Learner moved to RENAMES.
}
"""Renames in modules owned by other branches; see ``--owned``."""


def path_of(module: str) -> Path:
    return ROOT / (module.replace(".", "/") + ".py")


def move_files() -> None:
    for old, new in MODULES.items():
        src, dst = path_of(old), path_of(new)
        if src.exists() and not dst.exists():
            dst.parent.mkdir(parents=True, exist_ok=True)
            subprocess.run(["git", "mv", str(src), str(dst)], cwd=ROOT, check=True)


def files() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT,
                         check=True, capture_output=True, text=True).stdout.split("\n")
    me = Path(__file__).resolve()
    return [ROOT / f for f in out if f and (Path(f).suffix in SUFFIXES or f in EXTRA_FILES)
            and (ROOT / f).is_file() and (ROOT / f).resolve() != me]


# ----------------------------------------------------------------------- from-imports

_FROM = re.compile(r"^(?P<indent>[ \t]*)from (?P<mod>[\w.]+) import "
                   r"(?P<names>\([^)]*\)|[^\n]*(?:\\\n[^\n]*)*)(?P<tail>[^\n]*)$", re.M)


def _names(text: str) -> tuple[list[str], str]:
    """The imported names of a from-import's name list, and its trailing comment."""
    comment = ""
    body = text
    if not body.startswith("("):
        body, _, comment = body.partition("#")
        comment = "#" + comment if comment else ""
    body = re.sub(r"#[^\n]*", "", body).replace("\\\n", " ").strip("() \n")
    return [n.strip() for n in body.replace("\n", " ").split(",") if n.strip()], comment


def _render(indent: str, module: str, names: list[str], comment: str = "") -> str:
    head = f"{indent}from {module} import "
    line = head + ", ".join(names) + (f"  {comment.strip()}" if comment else "")
    if len(line) <= 99:
        return line
    lines, current = [], head + "("
    for i, name in enumerate(names):
        piece = name + ("," if i < len(names) - 1 else ")")
        if len(current) + len(piece) + 1 > 99 and not current.endswith("("):
            lines.append(current.rstrip())
            current = " " * len(head) + " "
        current += piece + " "
    lines.append(current.rstrip() + (f"  {comment.strip()}" if comment else ""))
    return "\n".join(lines)


def _split_import(match: re.Match[str], moved: dict[str, str]) -> str:
    """Split one from-import whose names ``moved`` maps (bare name -> new module)."""
    names, comment = _names(match["names"])
    if match["tail"].strip().startswith("#"):
        comment = match["tail"]
    stay = [n for n in names if n.split(" as ")[0].strip() not in moved]
    if len(stay) == len(names):
        return match.group(0)
    groups: dict[str, list[str]] = {}
    for n in names:
        target = moved.get(n.split(" as ")[0].strip())
        if target:
            groups.setdefault(target, []).append(n)
    out = [_render(match["indent"], match["mod"], stay, comment)] if stay else []
    out += [_render(match["indent"], mod, sorted(ns))
            for mod, ns in sorted(groups.items())]
    return "\n".join(out)


def rewrite_imports(text: str) -> str:
    by_package: dict[str, dict[str, str]] = {}
    for old, new in MODULES.items():
        package, _, leaf = old.rpartition(".")
        new_package, _, new_leaf = new.rpartition(".")
        # ``from gfcr.core import yamlfile`` -> ``from gfcr.config import yamlfile``
        by_package.setdefault(package, {})[leaf] = new_package if leaf == new_leaf else ""
    for (old, name), new in NAMES.items():
        by_package.setdefault(old, {})[name] = new

    def one(match: re.Match[str]) -> str:
        moved = {k: v for k, v in by_package.get(match["mod"], {}).items() if v}
        return _split_import(match, moved) if moved else match.group(0)
    return _FROM.sub(one, text)


# ----------------------------------------------------------------------- names and paths

def rewrite_names(text: str) -> str:
    for old, new in sorted(MODULES.items(), key=lambda kv: -len(kv[0])):
        text = re.sub(rf"(?<![\w.]){re.escape(old)}(?!\w)", new, text)
        old_path, new_path = old.replace(".", "/"), new.replace(".", "/")
        text = re.sub(rf"(?<![\w/.]){re.escape(old_path)}(?=\.py\b|\b(?!/))", new_path, text)
        short_old, short_new = old_path.partition("/")[2], new_path.partition("/")[2]
        text = re.sub(rf"(?<![\w/.]){re.escape(short_old)}(?=\.py\b|\b(?![/\w]))",
                      short_new, text)
    for (old, name), new in NAMES.items():
        text = re.sub(rf"(?<![\w.]){re.escape(old)}\.{name}\b", f"{new}.{name}", text)
    return text


def rewrite_renames(text: str, path: Path) -> str:
    for (module, old), new in RENAMES.items():
        text = re.sub(rf"(?<![\w.]){re.escape(module)}\.{old}\b", f"{module}.{new}", text)
        defines = path.resolve() == path_of(module).resolve()
        package, _, leaf = module.rpartition(".")
        # the module, or its package where the package re-exports the name
        sources = [re.escape(module), re.escape(package)]
        text = re.sub(rf"(?<![\w.]){re.escape(package)}\.{old}\b", f"{package}.{new}", text)
        if path.resolve().parent == path_of(module).resolve().parent:
            sources.append(rf"\.{leaf}")  # a relative import inside the package
        imports = any(re.search(rf"from {m} import (\([^)]*|[^\n]*)\b{old}\b", text)
                      for m in sources)
        if defines or imports:
            text = re.sub(rf"(?<![\w.]){old}\b", new, text)
    return text


def main(argv: list[str]) -> int:
    check = "--check" in argv
    if "--owned" in argv:
        RENAMES.update(OWNED_RENAMES)
    if not check and "--rewrite-only" not in argv:
        move_files()
    stale = []
    for path in files():
        before = path.read_text()
        after = rewrite_renames(rewrite_names(rewrite_imports(before)), path)
        if after != before:
            stale.append(path.relative_to(ROOT).as_posix())
            if not check:
                path.write_text(after)
    print("\n".join(stale) or "nothing to rewrite")
    return 1 if check and stale else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
