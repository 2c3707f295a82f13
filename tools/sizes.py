"""The house's size rules, checked: modules under 400 lines, functions under 60.

Usage: ``python tools/sizes.py``; exit status 1 when a file or function breaks a rule and
is not on the allow-list below (each entry with its reason), or when an allow-list entry
is no longer needed (so the list only shrinks). A function's length runs from its ``def``
line (decorators excluded) to its last line, docstring included. CI runs it (.ci/run).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHECKED = ("gfcr", "store", "stages", "pipelines", "bench", "tools")
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60

ALLOWED: dict[str, str] = {
    "bench/train.py": "a benchmark script of five measured scenarios; its size is its "
                      "tables and it is run, never imported",
}
"""path (module) or path:function -> why it may break the rule."""


def problems() -> tuple[list[str], set[str]]:
    found: list[str] = []
    used: set[str] = set()
    for package in CHECKED:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            source = path.read_text()
            lines = len(source.splitlines())
            if lines >= MAX_MODULE_LINES:
                (used.add(rel) if rel in ALLOWED else
                 found.append(f"{rel}: {lines} lines (rule: under {MAX_MODULE_LINES})"))
            for node in ast.walk(ast.parse(source, rel)):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    length = (node.end_lineno or node.lineno) - node.lineno + 1
                    key = f"{rel}:{node.name}"
                    if length >= MAX_FUNCTION_LINES:
                        (used.add(key) if key in ALLOWED else
                         found.append(f"{key} (line {node.lineno}): {length} lines "
                                      f"(rule: under {MAX_FUNCTION_LINES})"))
    return found, used


def main() -> int:
    found, used = problems()
    stale = [f"allow-list entry {k!r} is no longer needed; remove it" for k in ALLOWED
             if k not in used]
    for line in found + stale:
        print(line)
    print(f"size rules: {len(found)} violation(s), {len(stale)} stale allow-list "
          f"entr{'y' if len(stale) == 1 else 'ies'}, {len(used)} allowed")
    return 1 if found or stale else 0


if __name__ == "__main__":
    raise SystemExit(main())
