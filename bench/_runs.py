"""What bench/efficiency.py and bench/learning.py share: every configuration and seed
starts from one cached warm start, runs a shrunk pipeline in-process, and reports its
held-out accuracy curve. And what bench/agentic.py and bench/_envs_verifiers.py share:
a trained run's last weights, greedy held-out episodes on the HF engine with them (or
with the warm start), and a gain's spread over seeds.

Loaded by path from the scripts beside it (``bench/`` is taken off ``sys.path`` because
bench/store.py would shadow the ``store`` package).
"""


import hashlib
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Literal

from gfcr import Pipeline, Spec, register
from gfcr.core.loading import load
from gfcr.launch.run import execute
from stages import SFT


@register("warmstart")
class SharedWarmStart(Spec):
    """The default pipeline's SFT warm start with a fixed seed and cache folder, so every
    configuration and seed starts from the same (cached) weights."""

    type: Literal["_bench_shared_sft"] = "_bench_shared_sft"
    sft: SFT = SFT()
    """The warm start's settings."""
    seed: int = 0
    """The warm start's own seed, whatever the run's."""
    cache: str = ".gfcr/cache"
    """The cache folder every run shares."""
    task_seed: int | None = None
    """Train on the task drawn under this seed instead of the run's (a validation run on
    another task seed then starts from the reported runs' very weights)."""

    def run(self, policy: Any, task: Any, *, seed: int, cache_dir: Path,
            progress: Callable[[int, int], None] | None = None) -> dict[str, float]:
        if self.task_seed is not None and task.seed != self.task_seed:
            # a fresh model, not model_copy: that would share the task's private draw cache
            task = task.model_validate({**task.model_dump(), "seed": self.task_seed})
        return self.sft.run(policy, task, seed=self.seed, cache_dir=Path(self.cache),
                            progress=progress)


def random_reward(completion: str, answer: str | None, meta: str | None) -> float:
    """A control verifier (``Verify(scorer="_runs:random_reward")``; this module is
    ``_runs`` in ``sys.modules``): 1.0 or 0.0 from a hash of the prompt's task entry and
    the completion, a fixed coin flip per (prompt, completion), blind to correctness."""
    digest = hashlib.sha256(f"{meta}\x00{completion.strip()}".encode()).digest()
    return float(digest[0] & 1)


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


def last_weights(pipeline: Pipeline, root: Path) -> tuple[Any, Path]:
    """Run ``pipeline`` in-process under ``root`` (it checkpoints at its last step): its
    summary and the weights file of that last checkpoint."""
    from gfcr.checkpoints.checkpoint import directory, latest

    summary = execute(pipeline, root=root, executor="local")
    ckpt = latest(directory(root, summary.run_id))
    assert ckpt is not None and ckpt.step == pipeline.steps - 1, ckpt
    return summary, ckpt.path / "model.safetensors"


def heldout_rows(pipeline: Pipeline, weights: Path | None, stage: Any,
                 prompts: Any) -> list[dict[str, Any]]:
    """``stage``'s rows for ``prompts`` on the HF engine, the policy with ``weights``
    (None: ``pipeline``'s warm start): held-out episodes, run the same way for every
    checkpoint measured."""
    from gfcr.core.stage import StepContext
    from stages import HF

    policy = pipeline.policy.build(seed=0)
    if weights is None:
        pipeline.warmstart.run(policy, pipeline.task, seed=0, cache_dir=Path("unused"))
    else:
        policy.load_weights(weights)
    engine = HF(device="cpu").build(policy, seed=0)
    ctx = StepContext(run_id="heldout", step=0, seed=0, policy_version=0, task=pipeline.task)
    rows: list[dict[str, Any]] = stage.generate(ctx, prompts, engine, None).to_pylist()
    return rows


def mean_se(values: list[float]) -> tuple[float | None, float | None]:
    """The mean of ``values`` and its standard error ``sd / sqrt(n)`` (None for one
    value); (None, None) for none."""
    if not values:
        return None, None
    se = statistics.stdev(values) / len(values) ** 0.5 if len(values) > 1 else None
    return statistics.fmean(values), se


def ordered_evals(evals: dict[str, dict[str, list[Any]]]) -> list[tuple[str, dict[str, list[Any]]]]:
    """A run's greedy held-out evaluations (bench/real_long.py's ``evals``: label -> prompt
    ids, tokens, correct) in the order they ran: ``initial`` first, then ``step=N``."""
    labels = sorted(evals, key=lambda s: int(s.split("=")[1]) if "=" in s else -1)
    return [(label, evals[label]) for label in labels]


def prompt_diffs(after: dict[str, list[Any]], before: dict[str, list[Any]]) -> list[float]:
    """Per-prompt differences in correctness, in points, of two evaluations of the same
    held-out prompts (what a paired standard error is taken over)."""
    assert after["prompt_id"] == before["prompt_id"], "evaluations of other prompts"
    return [100.0 * (float(a) - float(b)) for a, b in zip(after["correct"], before["correct"])]


def spread(gains: list[float]) -> tuple[float, float, float]:
    """The mean of per-seed ``gains``, their standard deviation (0 for one seed) and the
    mean's standard error ``sd / sqrt(seeds)``."""
    sd = statistics.stdev(gains) if len(gains) > 1 else 0.0
    return statistics.mean(gains), sd, sd / len(gains) ** 0.5


def all_runs(names: list[str], seeds: int, one_run: Callable[[str, int, Path], dict[str, Any]],
             *, prefix: str) -> dict[str, list[dict[str, Any]]]:
    """``one_run(name, seed, root)`` for every configuration and seed, seeds outermost so
    a run cut short still compares like with like; one progress line per run on stderr."""
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        for seed in range(seeds):
            for name in names:
                run = one_run(name, seed, Path(tmp))
                runs[name].append(run)
                print(f"  {name} seed {seed}: {run['accuracy_start']:.3f} -> "
                      f"{run['accuracy_final']:.3f} ({run['run_seconds']:.0f}s)", file=sys.stderr)
    return runs


def add_common_args(ap: Any, configs: list[str], *, steps: int, every: int) -> None:
    """The options every configuration-by-seed benchmark takes."""
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--configs", default=",".join(configs), help="comma-separated subset")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=steps)
    ap.add_argument("--every", type=int, default=every, help="evaluate every N steps")
    ap.add_argument("--eval-size", type=int, default=512, help="held-out prompts evaluated")
    ap.add_argument("--lr", type=float, default=None, help="override the GRPO learning rate")
    ap.add_argument("--cache", type=Path, default=Path(".gfcr/cache"), help="warm-start cache")
    ap.add_argument("--out", type=Path, help="also write the JSON object to this file")


def settings(args: Any) -> dict[str, str]:
    """The command's options as strings, for the JSON object (not --json or --out)."""
    return {k: str(v) for k, v in vars(args).items() if k not in ("json", "out")}


def emit(result: dict[str, Any], args: Any, text: Callable[[], str]) -> None:
    """Write ``result`` to ``--out`` if given; print it as JSON with ``--json``, else
    print ``text()`` (the table and its summary line)."""
    if args.out:
        args.out.write_text(json.dumps(result))
    print(json.dumps(result) if args.json else text())


def config_names(args: Any, known: list[str], baseline: bool = True) -> list[str]:
    """``--configs`` as a list; exits naming the problem unless it includes the "grpo"
    baseline (when ``baseline``) and names only ``known`` configurations."""
    names = [n for n in args.configs.split(",") if n]
    if sorted(set(names) - set(known)) or (baseline and "grpo" not in names):
        sys.exit(f"--configs must include grpo and name only {sorted(known)}; got {names!r}")
    return names


# --------------------------------------------------------------------------- subprocess runs


def sibling(name: str) -> Any:
    """A helper module of ``bench/`` (``_trl``, ``_april``...), loaded by path once (this
    folder is off ``sys.path``, see above)."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
        assert spec is not None and spec.loader is not None
        sys.modules[name] = module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return sys.modules[name]


def child(script: Path, argv: list[str], what: str) -> dict[str, Any]:
    """Run ``script`` with ``argv`` in a subprocess (its own memory, and its own vLLM
    process where it starts one) and return its last stdout line, a JSON object; raise
    naming ``what`` with the end of its stderr if it fails."""
    done = subprocess.run([sys.executable, str(script), *argv], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{what} failed:\n{done.stderr[-3000:]}")
    out: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return out


def rerun(script: Path, one: str, seed: int) -> dict[str, Any]:
    """``script`` again as a child for one run (``--one ONE --seed SEED``), with this
    command's own options less ``--json``, ``--out``, ``--one`` and ``--seed``."""
    argv, skip = [], False
    for a in sys.argv[1:]:
        if skip:
            skip = False
        elif a in ("--out", "--one", "--seed"):
            skip = True
        elif a != "--json":
            argv.append(a)
    return child(script, [*argv, "--one", one, "--seed", str(seed)], f"{one} seed {seed}")
