"""What bench/efficiency.py and bench/learning.py share: every configuration and seed
starts from one cached warm start, runs a shrunk pipeline in-process, and reports its
held-out accuracy curve.

Loaded by path from the scripts beside it (``bench/`` is taken off ``sys.path`` because
bench/store.py would shadow the ``store`` package).
"""


import time
from pathlib import Path
from typing import Any, Literal

from gfcr import Pipeline, Spec, register
from gfcr.pipeline import load
from gfcr.run import execute
from stages import SFT


@register("warmstart")
class SharedWarmStart(Spec):
    """The default pipeline's SFT warm start with a fixed seed and cache folder, so every
    configuration and seed starts from the same (cached) weights."""

    type: Literal["_bench_shared_sft"] = "_bench_shared_sft"
    sft: SFT = SFT()
    seed: int = 0
    cache: str = ".gfcr/cache"

    def run(self, policy: Any, task: Any, *, seed: int, cache_dir: Path) -> dict[str, float]:
        return self.sft.run(policy, task, seed=self.seed, cache_dir=Path(self.cache))


def shrunk(base: Pipeline, name: str, seed: int, overrides: list[str], *, steps: int,
           every: int, eval_size: int, cache: Path) -> Pipeline:
    """``base`` with the benchmark's settings, ``overrides`` and the default's warm start
    (seed 0), so every configuration and seed starts from the same weights."""
    shared = [f"steps={steps}", f"seed={seed}", f"evaluation.every={every}",
              f"evaluation.size={eval_size}", "checkpoint.every=0"]
    data = base.with_overrides(shared + overrides).to_dict()
    data["warmstart"] = SharedWarmStart(sft=load("default").warmstart, cache=str(cache))
    return Pipeline(**{**data, "name": f"bench-{name}"})


def run_curve(pipeline: Pipeline, root: Path) -> dict[str, Any]:
    """Run ``pipeline`` in-process (no tracking) and return its per-step history, the
    held-out accuracy curve [(step, accuracy)] from the warm start on, and timings."""
    started = time.perf_counter()
    summary = execute(pipeline, root=root, executor="local")
    warm = summary.accuracy_warmstart
    curve = [(0, summary.accuracy_before if warm is None else warm)]
    curve += [(i + 1, m["heldout_accuracy"]) for i, m in enumerate(summary.history)
              if "heldout_accuracy" in m]
    curve.append((summary.steps, summary.accuracy_after))
    return {"history": summary.history, "curve": curve, "accuracy_start": curve[0][1],
            "accuracy_final": summary.accuracy_after, "steps": summary.steps,
            "run_seconds": time.perf_counter() - started}
