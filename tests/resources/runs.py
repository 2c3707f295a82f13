"""Short real runs built to show (or not show) the pathologies ``gfcr doctor`` checks,
and synthetic rows for the ones a short CPU run cannot produce cheaply.

Real runs (tiny Llama, CPU, local executor, 10-14 steps, 15-30 s each):
- ``healthy``: the default's stage chain (uniform sampler, group sampling, verifier,
  dynamic sampling, GRPO) on the learnable digits task: reward and held-out accuracy rise;
- ``too_large_lr``: GRPO at lr 0.3 on reasoning-gym sums: the policy jumps in one step;
- ``brevity``: a reward paying for short completions, never for correctness;
- ``flaky``: a scorer that raises on a third of the completions.

Synthetic rows (written through ``RolloutStore.commit_step``, the store's real commit
path, with a real stored spec): ``offpolicy_store`` (stale replayed rows and truncated
IS weights, which need a replay pipeline run far longer than a test allows) and
reward rising while held-out accuracy falls (the accuracies through
``RolloutStore.record_evaluation``), and scorer timeouts (a real
scorer that hangs past Verify's timeout blocks the calls after it, so a short run either
shows none or fails a whole step and stops, depending on the machine's load).
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from gfcr import Evaluation
from gfcr.core.rollout import ROLLOUT_SCHEMA
from gfcr.launch.hooks import RunSummary
from gfcr.launch.run import execute
from tests.conftest import tiny_pipeline


def healthy_pipeline(steps: int = 12) -> Any:
    from stages import GRPO, DynamicSampling, GroupSample, UniformSampler, Verify
    from tests.resources.digits import Digits

    return tiny_pipeline(
        name="healthy", task=Digits(), steps=steps,
        stages=[UniformSampler(batch=8), GroupSample(n=4, max_tokens=4), Verify(),
                DynamicSampling(), GRPO(lr=1e-2)],
        evaluation=Evaluation(size=8, max_tokens=4, every=4))


def pathology_pipeline(name: str, *, scorer: str = "task", lr: float = 1e-3,
                       max_tokens: int = 6, steps: int = 10) -> Any:
    from stages import GRPO, DynamicSampling, GroupSample, UniformSampler, Verify

    verify = Verify() if scorer == "task" else Verify(scorer=scorer)
    return tiny_pipeline(
        name=name, steps=steps,
        stages=[UniformSampler(batch=4), GroupSample(n=4, max_tokens=max_tokens), verify,
                DynamicSampling(), GRPO(lr=lr)])


PATHOLOGIES: dict[str, dict[str, Any]] = {
    "too_large_lr": dict(lr=0.3),
    "brevity": dict(scorer="tests.resources.pathologies:brevity", lr=3e-2, max_tokens=12),
    "flaky": dict(scorer="tests.resources.pathologies:flaky"),
}


def run(pipeline: Any, root: Path, **kw: Any) -> RunSummary:
    return execute(pipeline, root=root, executor=kw.pop("executor", "local"),
                   run_id=kw.pop("run_id", pipeline.name), **kw)


def _rows(run_id: str, step: int, n: int, rng: np.random.Generator, *, stale: int,
          prompts: list[str], pass_rate: float, timeouts: int = 0) -> pa.Table:
    """``n`` synthetic rollouts in groups of 4, right with probability ``pass_rate``;
    with ``stale`` > 0 half of them are replayed from that many policy versions back."""
    replayed = (np.arange(n) % 2 == 0) & (stale > 0)
    reward = (rng.random(n) < pass_rate).astype(float).tolist()
    now = datetime.now(timezone.utc)
    return pa.Table.from_pydict({
        "run_id": [run_id] * n, "step": [step] * n,
        "rollout_id": [f"{run_id}/{step}/{i}" for i in range(n)],
        "prompt_id": [prompts[(i // 4) % len(prompts)] for i in range(n)],
        "group_id": [f"{run_id}/{step}/g{i // 4}" for i in range(n)],
        "sample_idx": [i % 4 for i in range(n)], "parent_id": [None] * n, "task": ["t"] * n,
        "prompt": ["1 + 1 ="] * n, "answer": ["2"] * n, "meta": [None] * n,
        "completion": [f"{rng.integers(0, 99)}" for _ in range(n)],
        "prompt_ids": [[1, 2, 3]] * n, "completion_ids": [[4, 5]] * n,
        "logprobs": [[-1.0 - 0.1 * rng.random(), -1.2]] * n,
        "policy_version_start": [max(step - stale, 0) if r else step for r in replayed],
        "policy_version_end": [max(step - stale, 0) if r else step for r in replayed],
        "finish_reason": ["stop"] * n, "status": ["complete"] * n, "reward": reward,
        "rewards": [[("correct", r)] for r in reward],
        "score_error": ["TimeoutError: scorer ran past its limit of 10s" if i < timeouts else None
                        for i in range(n)],
        "advantage": [None] * n, "kept": [i >= timeouts for i in range(n)],
        "dropped_by": ["verify" if i < timeouts else None for i in range(n)],
        "drop_reason": ["score_error" if i < timeouts else None for i in range(n)], "consumed_at_step": [step] * n,
        "replay_count": [1 if r else 0 for r in replayed], "n_tokens": [2] * n,
        "gen_seconds": [0.01] * n, "created_at": [now] * n, "turns": [None] * n,
    }, schema=ROLLOUT_SCHEMA)


def synthetic_run(store: Any, run_id: str, metrics: list[dict[str, float]], *, stale: int = 0,
                  seed: int = 0, timeouts: int = 0) -> None:
    """A run with a real stored spec (the tiny pipeline) and one committed step per
    ``metrics`` entry, each of 32 synthetic rollouts right at the rate the entry's
    ``reward_mean`` says (0.5 without it); the first ``timeouts`` rows of each step carry
    a scorer timeout and are dropped."""
    spec = tiny_pipeline(name=run_id, steps=len(metrics))
    store.start_run(run_id, pipeline=spec.name, spec_yaml=spec.to_yaml(),
                    spec_hash=spec.spec_hash(), code_version="test")
    rng = np.random.default_rng(seed)
    prompts = [f"p{i}" for i in range(4)]
    for step, m in enumerate(metrics):
        rows = _rows(run_id, step, 32, rng, stale=stale, prompts=prompts,
                     pass_rate=m.get("reward_mean", 0.5), timeouts=timeouts)
        store.commit_step(run_id, step, rows, policy_version=step, metrics=m)
    store.finish_run(run_id, "finished")
