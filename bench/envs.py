"""Learning on environments from the ecosystem: a TextArena game and a verifiers
environment, each trained from a warm start and measured against it on held-out episodes.

**TextArena.** SmolLM2-135M-Instruct (its pretrained weights are the warm start) plays
TextArena's ``GuessTheNumber-v0`` (1..``--high``, ``--game-turns`` guesses; the game's
reward: 1 for the number, else its partial credit ``1 - |last guess - target| / range``,
0 for no valid guess) through ``TextArenaEnv``, trained with GRPO on the game's reward.
Each task row seeds one game instance (a group of ``--n`` episodes plays it); held-out
rows are games whose seeds training never saw. The held-out rows are split in two: on
the validation half each learning rate of ``--lrs`` is measured at each checkpoint
(every ``--every`` steps up to ``--steps``) and the best is chosen; the test half
measures the chosen weights and the warm start, greedily, on the HF engine.
``textarena_gain`` is the mean of the paired per-episode differences (after - before)
of the game's reward on the test half, ``textarena_gain_se`` their standard error
(sd / sqrt(episodes)): the noise of the held-out episodes, one training seed.

**Verifiers.** ``verifiers_gain`` and ``verifiers_gain_se`` come from
``bench/_envs_verifiers.py: verifiers_gain()`` when that file exists (the VerifiersEnv
work); otherwise they are null with the reason under ``verifiers_note``.

    .venv/bin/python bench/envs.py                   # table
    .venv/bin/python bench/envs.py --json            # one JSON object
    .venv/bin/python bench/envs.py --steps 2 --every 2 --lrs 1e-5 --val 4 --test 4  # smoke
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

from gfcr import Evaluation, Pipeline  # noqa: E402
from gfcr.core.stage import StepContext  # noqa: E402
from gfcr.launch.run import execute  # noqa: E402
from gfcr.checkpoints.checkpoint import directory  # noqa: E402
from stages import (GRPO, HF, ReasoningGym, SmolLM2, TextArenaEnv,  # noqa: E402
                    UniformSampler)

SYSTEM = "You play a game. Reply with only your move, in square brackets, like [7]."
"""The system message before the game's prompt (replacing SmolLM2's default one)."""


def arena_stage(args: argparse.Namespace) -> Any:
    """The Episodes stage playing the game (training samples at temperature 1); one
    policy turn more than the game's guesses, for the retry after a first invalid move
    that TextArena allows."""
    return TextArenaEnv(game="GuessTheNumber-v0", system=SYSTEM,
                        game_options={"min_number": 1, "max_number": args.high,
                                      "max_turns": args.game_turns},
                        n=args.n, max_turns=args.game_turns + 1, max_tokens=args.max_tokens,
                        max_episode_tokens=200, temperature=1.0)


def pipeline(args: argparse.Namespace, lr: float, root: Path) -> Pipeline:
    """GRPO on the game from SmolLM2's pretrained weights, checkpointed every ``every``."""
    task = ReasoningGym(dataset="chain_sum", train_size=400,
                        heldout_size=args.val + args.test)
    return Pipeline(
        name="bench-envs-textarena", seed=0, steps=args.steps, task=task,
        policy=SmolLM2(root=str(args.model_root)), engine=HF(device="cpu"),
        evaluation=Evaluation(every=0, size=4, max_tokens=4),
        checkpoint={"every": args.every, "keep": 64},
        stages=[UniformSampler(batch=args.batch), arena_stage(args),
                GRPO(lr=lr, micro_batch=8)])


def heldout(p: Pipeline, weights: Path | None, start: int, size: int, args: argparse.Namespace
            ) -> list[float]:
    """The game's reward of greedy episodes on held-out rows ``[start, start+size)``."""
    policy = p.policy.build(seed=0)
    if weights is not None:
        policy.load_weights(weights)
    engine = HF(device="cpu").build(policy, seed=0)
    stage = arena_stage(args).model_copy(update={"n": 1, "temperature": 0.0})
    prompts = p.task.heldout_prompts().slice(start, size)
    ctx = StepContext(run_id="heldout", step=0, seed=0, policy_version=0, task=p.task)
    rows = stage.generate(ctx, prompts, engine, None).to_pylist()
    return [float(r["reward"] or 0.0) for r in rows]


def paired(after: list[float], before: list[float]) -> tuple[float, float]:
    """Mean and standard error of the per-episode differences."""
    diffs = [a - b for a, b in zip(after, before)]
    sd = statistics.stdev(diffs) if len(diffs) > 1 else 0.0
    return statistics.mean(diffs), sd / len(diffs) ** 0.5


def textarena(args: argparse.Namespace) -> dict[str, Any]:
    """Train at each lr, choose (lr, step) on validation, measure it on test."""
    started, runs = time.perf_counter(), []
    with tempfile.TemporaryDirectory(prefix="gfcr-envs-") as tmp:
        base = pipeline(args, args.lrs[0], Path(tmp))
        val_before = heldout(base, None, 0, args.val, args)
        for lr in args.lrs:
            root = Path(tmp) / f"lr{lr:g}"
            summary = execute(pipeline(args, lr, root), root=root, executor="local")
            for ckpt in sorted(directory(root, summary.run_id).glob("step-*")):
                step = int(ckpt.name.split("-")[-1])
                val = heldout(base, ckpt / "model.safetensors", 0, args.val, args)
                runs.append({"lr": lr, "step": step, "path": str(ckpt),
                             "val_reward": statistics.mean(val),
                             "train_reward_last": summary.history[-1].get("reward_mean")})
                print(f"  lr {lr:g} step {step}: validation {statistics.mean(val):.3f} "
                      f"(warm start {statistics.mean(val_before):.3f})", file=sys.stderr)
        best = max(runs, key=lambda r: r["val_reward"])
        before = heldout(base, None, args.val, args.test, args)
        after = heldout(base, Path(best["path"]) / "model.safetensors", args.val, args.test,
                        args)
    gain, se = paired(after, before)
    return {"textarena_gain": gain, "textarena_gain_se": se,
            "textarena": {"game": "GuessTheNumber-v0", "chosen": best, "candidates": runs,
                          "test_before": statistics.mean(before),
                          "test_after": statistics.mean(after), "test_episodes": len(after),
                          "validation_before": statistics.mean(val_before),
                          "seconds": time.perf_counter() - started}}


def measured(args: argparse.Namespace) -> dict[str, Any]:
    """``--checkpoint``: the test half for given weights against the warm start (no
    training, no selection: the weights were chosen elsewhere)."""
    base = pipeline(args, args.lrs[0], Path("unused"))
    before = heldout(base, None, args.val, args.test, args)
    after = heldout(base, args.checkpoint / "model.safetensors", args.val, args.test, args)
    gain, se = paired(after, before)
    return {"textarena_gain": gain, "textarena_gain_se": se,
            "textarena": {"game": "GuessTheNumber-v0", "chosen": {
                "lr": args.lrs[0], "step": args.checkpoint.name, "path": str(args.checkpoint)},
                "test_before": statistics.mean(before), "test_after": statistics.mean(after),
                "test_episodes": len(after), "before": before, "after": after}}


def verifiers() -> dict[str, Any]:
    """The verifiers half, from bench/_envs_verifiers.py when it exists."""
    path = Path(__file__).with_name("_envs_verifiers.py")
    if not path.is_file():
        return {"verifiers_gain": None, "verifiers_gain_se": None,
                "verifiers_note": "not run: bench/_envs_verifiers.py is not on this branch"}
    spec = importlib.util.spec_from_file_location("_envs_verifiers", path)
    assert spec is not None and spec.loader is not None
    module = sys.modules["_envs_verifiers"] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    got: dict[str, Any] = module.verifiers_gain(seeds=3)
    return got


def table(result: dict[str, Any]) -> str:
    t = result.get("textarena") or {}
    lines = [f"{'environment':<28}{'before':>8}{'after':>8}{'gain':>9}{'se':>8}",
             "-" * 61]
    if t:
        lines.append(f"{'TextArena ' + t['game']:<28}{t['test_before']:>8.3f}"
                     f"{t['test_after']:>8.3f}{result['textarena_gain']:>+9.3f}"
                     f"{result['textarena_gain_se']:>8.3f}")
        c = t["chosen"]
        lines.append(f"  chosen on validation: lr {c['lr']:g}, step {c['step']} "
                     f"({t['test_episodes']} test episodes)")
    v = result.get("verifiers_gain")
    lines.append(f"{'verifiers':<28}" + (f"{'':>16}{v:>+9.3f}{result['verifiers_gain_se']:>8.3f}"
                                         if v is not None else
                                         f"  {result.get('verifiers_note', 'not run')}"))
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--only", choices=["textarena", "verifiers"], help="run one half")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--every", type=int, default=4, help="checkpoint (candidate) interval")
    ap.add_argument("--lrs", type=lambda s: [float(x) for x in s.split(",")],
                    default=[1e-5], help="comma-separated learning rates")
    ap.add_argument("--batch", type=int, default=8, help="games per step")
    ap.add_argument("--n", type=int, default=4, help="episodes per game")
    ap.add_argument("--high", type=int, default=16, help="the number is in 1..high")
    ap.add_argument("--game-turns", type=int, default=2, help="guesses per game")
    ap.add_argument("--max-tokens", type=int, default=6, help="tokens per reply")
    ap.add_argument("--val", type=int, default=32, help="validation games")
    ap.add_argument("--test", type=int, default=64, help="test games")
    ap.add_argument("--model-root", type=Path, default=Path(".gfcr"),
                    help="where SmolLM2's converted checkpoint is cached")
    ap.add_argument("--checkpoint", type=Path,
                    help="measure this checkpoint folder (trained at --lrs' first) on the "
                         "test half against the warm start, without training")
    ap.add_argument("--out", type=Path, help="also write the JSON object to this file")
    args = ap.parse_args()
    started = time.perf_counter()
    result: dict[str, Any] = {}
    if args.only != "verifiers":
        result.update(measured(args) if args.checkpoint else textarena(args))
    if args.only != "textarena":
        result.update(verifiers())
    result["seconds"] = time.perf_counter() - started
    result["settings"] = {k: (str(v) if isinstance(v, Path) else v)
                          for k, v in vars(args).items()}
    text = json.dumps(result, indent=1, default=str)
    if args.out:
        args.out.write_text(text)
    print(text if args.json else table(result))


if __name__ == "__main__":
    main()
