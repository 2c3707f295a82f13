"""Learning in a verifiers multi-turn environment: held-out episode success, trained vs
its warm start (``verifiers_gain``; bench/envs.py reports it).

The environment is written here for verifiers 0.4.0 (v1): a taskset of the default
pipeline's sums (reasoning-gym ``chain_sum``, its scorer), and an ``Env`` of two tries:
a wrong first answer hears "wrong, try again. hint: <answer>." and the question again
(the agentic pipeline's episode, as a verifiers environment). The rubric's one reward,
``solved``, is 1.0 when either try is right. ``args={"split": "train"}`` holds the
default task's training prompts, ``"heldout"`` its held-out ones.

Training: the default pipeline's policy and SFT warm start (its task's answers, cached
in ``cache``), then ``steps`` GRPO steps of ``batch`` tasks x ``n`` episodes of
``VerifiersEnv`` on the HF engine, the tasks from ``VerifiersTask`` over the training
split (whose own held-out fifth is the validation split). Steps, batch and learning rate
are the agentic pipeline's (bench/agentic.py's defaults), not chosen on the held-out
prompts. Measurement: greedy episodes (the same environment, ``n=1``, temperature 0) on
the first ``eval_size`` held-out prompts, with the warm start and with each seed's last
weights; the gain is in points of success, its standard error ``sd / sqrt(seeds)``.

Loaded by path (``bench/`` is off ``sys.path``); the environment is this module, found
under its own name in ``sys.modules``.
"""

from __future__ import annotations

import importlib.util
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Literal

sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import verifiers.v1 as vf  # noqa: E402

_MODULE = __name__
"""The environment's module name (the taskset id VerifiersEnv imports)."""


class SumData(vf.TaskData):
    answer: str = ""
    meta: str | None = None


class SumTask(vf.Task[SumData]):
    @vf.reward(weight=1.0)
    async def solved(self, trace: vf.Trace) -> float:
        return float(any(_right(self.data, text) for text in _replies(trace)))


def _replies(trace: Any) -> list[str]:
    return [str(n.message.content or "") for n in trace.nodes if n.message.role == "assistant"]


def _right(data: SumData, text: str) -> bool:
    return _task().score(text, data.answer, data.meta) == 1.0


def _task() -> Any:
    from pipelines.default import task
    return task


class SumConfig(vf.TasksetConfig):
    split: Literal["train", "heldout"] = "train"


class SumTaskset(vf.Taskset[SumTask, SumConfig]):
    def load(self) -> list[SumTask]:
        table = (_task().train_prompts() if self.config.split == "train"
                 else _task().heldout_prompts())
        return [SumTask(SumData(prompt=r["prompt"], answer=r["answer"], meta=r["meta"]),
                        self.config.task) for r in table.to_pylist()]


class TwoTriesConfig(vf.EnvConfig):
    agent: vf.AgentConfig = vf.AgentConfig()


class TwoTries(vf.Env[TwoTriesConfig]):
    async def run(self, task: Any, agents: Any) -> None:
        async with agents.agent.interaction(task) as talk:
            first = await talk.turn()
            if first.terminated or _right(task.data, first.last_reply):
                return
            await talk.turn(f"wrong, try again. hint: {task.data.answer}.\n"
                            f"{task.data.prompt}")


__all__ = ["SumTaskset", "TwoTries"]


def _sibling(name: str) -> Any:
    """A helper module beside this one, loaded by path (this folder is off sys.path)."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(
            f"{name}.py"))
        assert spec is not None and spec.loader is not None
        sys.modules[name] = module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return sys.modules[name]


def _pipeline(seed: int, steps: int, batch: int, n: int, lr: float, cache: Path) -> Any:
    from gfcr import Evaluation, Pipeline
    from gfcr.core.loading import load
    from pipelines.default import policy
    from stages import GRPO, HF, UniformSampler, VerifiersEnv, VerifiersTask

    sys.modules.setdefault(_MODULE, sys.modules[__name__])
    return Pipeline(
        name="bench-verifiers", seed=seed, steps=steps, policy=policy,
        engine=HF(device="cpu"),
        task=VerifiersTask(module=_MODULE, args={"split": "train"}),
        warmstart=_sibling("_runs").SharedWarmStart(sft=load("default").warmstart,
                                                    cache=str(cache)),
        evaluation=Evaluation(size=16, max_tokens=8),
        checkpoint={"every": steps},
        stages=[UniformSampler(batch=batch),
                VerifiersEnv(module=_MODULE, n=n, max_tokens=8, max_turns=2,
                             temperature=1.0),
                GRPO(lr=lr)])


def heldout(p: Any, weights: Path | None, eval_size: int) -> float:
    """Greedy held-out episode success with ``weights`` (None: the warm start)."""
    import pyarrow as pa
    from gfcr.core.rollout import PROMPT_SCHEMA, prompt_id
    from stages import VerifiersEnv

    stage = VerifiersEnv(module=_MODULE, args={"split": "heldout"}, n=1, max_tokens=8,
                         max_turns=2, temperature=0.0)
    tasks = [t for t in stage._env.taskset][:eval_size]
    plan = pa.Table.from_pylist(
        [{"prompt_id": prompt_id(_MODULE, t.data.prompt), "task": _MODULE,
          "prompt": t.data.prompt, "answer": t.data.answer,
          "meta": json.dumps({"vf_idx": t.data.idx})} for t in tasks], schema=PROMPT_SCHEMA)
    rows = _sibling("_runs").heldout_rows(p, weights, stage, plan)
    return statistics.mean(float((r["reward"] or 0.0) > 0) for r in rows)


def verifiers_gain(seeds: int, *, steps: int = 10, batch: int = 16, n: int = 8,
                   lr: float = 3e-5, eval_size: int = 256,
                   cache: Path = Path(".gfcr/cache")) -> dict[str, Any]:
    """Held-out success gain (points) of GRPO in the two-tries environment over its warm
    start, over ``seeds`` seeds: ``verifiers_gain``, ``verifiers_gain_se`` and details."""
    shared = _sibling("_runs")
    started = time.perf_counter()
    warm = heldout(_pipeline(0, steps, batch, n, lr, cache), None, eval_size)
    gains, runs = [], []
    with tempfile.TemporaryDirectory(prefix="gfcr-verifiers-") as tmp:
        for seed in range(seeds):
            p, root = _pipeline(seed, steps, batch, n, lr, cache), Path(tmp) / str(seed)
            t0 = time.perf_counter()
            summary, weights = shared.last_weights(p, root)
            after = heldout(p, weights, eval_size)
            gains.append(100.0 * (after - warm))
            runs.append({"seed": seed, "success": after, "seconds": time.perf_counter() - t0,
                         "train_reward_first": summary.history[0].get("reward_mean"),
                         "train_reward_last": summary.history[-1].get("reward_mean")})
            print(f"  verifiers seed {seed}: {warm:.3f} -> {after:.3f} "
                  f"({runs[-1]['seconds']:.0f}s)", file=sys.stderr)
    mean, _, se = shared.spread(gains)
    return {"verifiers_gain": mean, "verifiers_gain_se": se,
            "verifiers_warm_start": warm, "verifiers_gains": gains, "verifiers_runs": runs,
            "verifiers_settings": {"steps": steps, "batch": batch, "n": n, "lr": lr,
                                   "eval_size": eval_size},
            "verifiers_seconds": time.perf_counter() - started}


if __name__ == "__main__":  # a smoke run: python bench/_envs_verifiers.py SEEDS [STEPS EVAL]
    argv = [int(a) for a in sys.argv[1:]] + [3, 10, 256][len(sys.argv) - 1:]
    print(json.dumps(verifiers_gain(argv[0], steps=argv[1], eval_size=argv[2]), indent=1))
