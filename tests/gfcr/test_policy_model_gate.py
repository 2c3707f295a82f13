"""The CI gate tools/policy_model.py: only the engines and the learner reach into the
policy's model."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _gate():
    spec = importlib.util.spec_from_file_location("policy_model", ROOT / "tools" / "policy_model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_no_module_outside_the_engines_and_the_learner_reaches_into_policy_model():
    assert _gate().problems() == []


def test_a_reach_outside_them_is_named_with_its_line(tmp_path):
    (tmp_path / "gfcr").mkdir()
    (tmp_path / "gfcr" / "sync.py").write_text(
        "def copy(engine, policy):\n    state = policy.model.state_dict()\n"
        "    engine.policy.model.load_state_dict(state)\n    return policy.version\n")
    (tmp_path / "stages" / "engines").mkdir(parents=True)
    (tmp_path / "stages" / "engines" / "mine.py").write_text("x = self._policy.model\n")
    found = _gate().problems(tmp_path)
    assert [p.split(": ")[0] for p in found] == ["gfcr/sync.py:2", "gfcr/sync.py:3"]
