"""The weights' owner, checked: no module outside the engines and the learner reaches
into the policy's model.

The learner owns the policy (gfcr.core.services.Learner); weights leave it only as handles
that generators load. So ``<something policy>.model`` (``policy.model``,
``self._policy.model``, ``engine.policy.model``) may appear only in the engines
(``stages/engines/``) and the learner and warm start (``stages/train/``); the Policy's
own methods (gfcr.core.policy.Policy) use ``self.model``, which is not such a reach.

Usage: ``python tools/policy_model.py``; exit status 1 naming each reach (file:line).
CI runs it (.ci/run). Benchmarks and tests are harnesses and are not checked.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHECKED = ("gfcr", "store", "stages", "pipelines")
OWNERS = ("stages/engines/", "stages/train/")


def _names_policy(node: ast.expr) -> bool:
    """Whether ``node`` is a name or attribute that names a policy."""
    if isinstance(node, ast.Name):
        return "policy" in node.id.lower()
    if isinstance(node, ast.Attribute):
        return "policy" in node.attr.lower()
    return False


def reaches(path: Path) -> list[int]:
    """Lines of ``path`` where a policy's ``model`` is read or written."""
    tree = ast.parse(path.read_text(), filename=str(path))
    return sorted(node.lineno for node in ast.walk(tree)
                  if isinstance(node, ast.Attribute) and node.attr == "model"
                  and _names_policy(node.value))


def problems(root: Path = ROOT) -> list[str]:
    found = []
    for package in CHECKED:
        for path in sorted((root / package).rglob("*.py")):
            relative = path.relative_to(root).as_posix()
            if relative.startswith(OWNERS):
                continue
            found += [f"{relative}:{line}: reaches into the policy's model; only the "
                      f"engines ({OWNERS[0]}) and the learner ({OWNERS[1]}) may: move "
                      "weights as gfcr.core.services.WeightHandle values"
                      for line in reaches(path)]
    return found


def main() -> int:
    found = problems()
    for problem in found:
        print(problem)
    print(f"policy.model reaches outside the engines and the learner: {len(found)}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
