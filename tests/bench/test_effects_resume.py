"""bench/effects.py ``--resume``: a smol-long effects measurement longer than one sitting
(3 seeds of 4 arms are 3.5-6 hours here) goes on from an earlier ``--out``. The kept runs
are not run again and the figures are computed from them as from fresh ones; a file made
with other settings is refused, naming the setting."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _run(seed: int, tail: list[float], final_tokens: int, final_correct: list[int]) -> dict:
    """One bench/real_long.py run as --out keeps it: 4 steps, 2 held-out prompts."""
    ev = {"prompt_id": [0, 1], "n_tokens": [40, 40], "correct": [0, 0]}
    return {"engine": "vllm", "seed": seed, "accuracy_start": 0.0,
            "accuracy_final": sum(final_correct) / 2, "step_lengths": [40.0, 40.0, *tail],
            "tokens": [100.0] * 4, "run_seconds": 1.0,
            "evals": {"initial": ev, "step=0": ev,
                      "step=4": {"prompt_id": [0, 1], "n_tokens": [final_tokens] * 2,
                                 "correct": final_correct}}}


def _effects(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    # --models names no folder: a run that is not kept would fail at once
    return subprocess.run([sys.executable, str(REPO / "bench/effects.py"), "--only", "overlong",
                           "--engine", "vllm", "--models", str(tmp_path / "absent"), *argv],
                          capture_output=True, text=True, timeout=300, cwd=REPO)


@pytest.fixture
def earlier(tmp_path: Path) -> Path:
    runs = {"grpo": [_run(0, [30, 30], 30, [1, 0]), _run(1, [30, 30], 30, [1, 0])],
            "overlong": [_run(0, [24, 24], 15, [0, 1]), _run(1, [27, 27], 15, [0, 1])]}
    path = tmp_path / "earlier.json"
    path.write_text(json.dumps({"settings": {"steps": "None", "engine": "vllm",
                                             "eval_size": "256"}, "long_runs": runs}))
    return path


def test_kept_runs_are_not_run_again_and_give_the_figures(tmp_path, earlier):
    out = tmp_path / "out.json"
    done = _effects(tmp_path, "--seeds", "2", "--resume", str(earlier), "--out", str(out),
                    "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["overlong_length_ratio_per_seed"] == pytest.approx([0.8, 0.9])
    assert result["overlong_length_ratio"] == pytest.approx(0.85)
    assert result["overlong_length_ratio_se"] == pytest.approx(0.05)
    assert result["overlong_eval_length_ratio"] == pytest.approx(0.5)
    assert result["overlong_accuracy_diff"] == 0.0 and result["overlong_equal_accuracy"]
    assert result["long_runs"] == json.loads(earlier.read_text())["long_runs"]
    assert result["warm_start_accuracy"] == [0.0] and "warm_start_note" not in result
    assert json.loads(out.read_text()) == result
    assert done.stderr.count(f"kept from {earlier}") == 4


def test_a_file_made_with_other_settings_is_refused_naming_them(tmp_path, earlier):
    done = _effects(tmp_path, "--seeds", "2", "--steps", "8", "--resume", str(earlier))
    assert done.returncode != 0
    assert f"--resume {earlier}: made with other settings" in done.stderr
    assert "'steps': ('None', '8')" in done.stderr


def test_a_file_that_is_not_an_effects_output_is_refused(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"runs": []}))
    done = _effects(tmp_path, "--resume", str(bad))
    assert done.returncode != 0
    assert f"--resume {bad}: not an --out of bench/effects.py" in done.stderr
