"""Distinct answers of LATR tree rollouts against independent samples, at equal tokens.

The claim behind LATR (Xing et al. 2025) is that independent samples of a prompt collapse
onto the same few answers, while a tree that branches where the policy hesitates and
prunes look-alike branches explores more distinct trajectories for the same compute.

Measured on a real tiny model: the default pipeline's policy (TinyLlama, character
tokenizer) warm-started by the default SFT on chain_sum (cached under ``--root``, shared
with ``gfcr run``), sampled at T=1. For each prompt:

- the tree (``TreeRollout``: ``n`` leaves) is grown once; its *token cost* counts every
  token generated once — shared prefixes once, pruned branches' lookahead included
  (``n_tokens - branch_pos`` per branch, ``n_tokens`` per root);
- independent samples (``GroupSample``) are drawn from a larger pool and taken in order
  until their tokens reach the tree's cost for that prompt (so the independent side may
  spend slightly more, never less).

Reported per side: mean distinct answers per prompt (stripped completions), the
distinct-answer rate (distinct / rollouts), rollouts and tokens spent, and the share of
prompts with at least one correct answer (coverage). ``distinct_ratio`` is tree /
independent mean distinct answers per prompt; > 1 means the tree explores more.
"""

from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from gfcr.core.loading import load
from gfcr.core.rollout import col
from gfcr.core.stage import StepContext
from stages import GroupSample, TreeRollout
from stages.generate.tree import BRANCH_POS


def _policy_and_engine(root: Path, sft_steps: int | None, seed: int) -> tuple[Any, Any, Any]:
    p = load("default")
    policy = p.policy.build(seed=seed)
    warm = p.warmstart if sft_steps is None else p.warmstart.model_copy(update={"steps": sft_steps})
    warm.run(policy, p.task, seed=seed, cache_dir=root / "cache")
    return p.task, policy, p.engine.build(policy, seed=seed)


def _by_prompt(table: Any) -> dict[str, list[dict[str, Any]]]:
    rows: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in table.to_pylist():
        rows[r[col.PROMPT_ID]].append(r)
    return rows


def _tree_side(task: Any, rows: list[dict[str, Any]]) -> tuple[set[str], int, int, bool]:
    leaves = [r for r in rows if r[col.STATUS] == "complete"]
    tokens = sum(r[col.N_TOKENS] - (r[BRANCH_POS] or 0) for r in rows)
    answers = {r[col.COMPLETION].strip() for r in leaves}
    solved = any(task.score(r[col.COMPLETION], r[col.ANSWER], r[col.META]) >= 1 for r in leaves)
    return answers, len(leaves), tokens, solved


def _independent_side(task: Any, rows: list[dict[str, Any]], budget: int
                      ) -> tuple[set[str], int, int, bool]:
    answers, used, taken, solved = set(), 0, 0, False
    for r in sorted(rows, key=lambda r: r[col.SAMPLE_IDX]):
        if used >= budget:
            break
        used += r[col.N_TOKENS]
        taken += 1
        answers.add(r[col.COMPLETION].strip())
        solved |= task.score(r[col.COMPLETION], r[col.ANSWER], r[col.META]) >= 1
    return answers, taken, used, solved


def tree_vs_independent(*, prompts: int = 64, n: int = 8, max_tokens: int = 8,
                        branch_prob: float = 0.2, lookahead: int = 2,
                        min_distance: float = 0.4, temperature: float = 1.0,
                        pool: int = 4, seeds: tuple[int, ...] = (0, 1, 2),
                        root: Path = Path(".gfcr"), sft_steps: int | None = None) -> dict:
    """Distinct answers per prompt of tree rollouts and of independent samples at the same
    token budget, averaged over ``seeds``; see the module docstring."""
    started = time.perf_counter()
    task, policy, engine = _policy_and_engine(Path(root), sft_steps, 0)
    plan = task.heldout_prompts().slice(0, prompts)
    tree = TreeRollout(n=n, branch_prob=branch_prob, lookahead=lookahead,
                       min_distance=min_distance, temperature=temperature, max_tokens=max_tokens)
    indep = GroupSample(n=pool * n, temperature=temperature, max_tokens=max_tokens,
                        segment_tokens=max_tokens)
    sides: dict[str, dict[str, list[float]]] = {
        "tree": defaultdict(list), "independent": defaultdict(list)}
    short = 0
    for seed in seeds:
        ctx = StepContext(run_id="bench", step=seed, seed=seed, policy_version=0, task=task)
        t_rows = _by_prompt(tree.generate(ctx, plan, engine, None))
        i_rows = _by_prompt(indep.generate(ctx, plan, engine, None))
        for pid, rows in t_rows.items():
            t = _tree_side(task, rows)
            i = _independent_side(task, i_rows[pid], t[2])
            short += i[2] < t[2]  # the pool ran out before the budget
            for name, (answers, count, tokens, solved) in (("tree", t), ("independent", i)):
                sides[name]["distinct"].append(len(answers))
                sides[name]["rollouts"].append(count)
                sides[name]["tokens"].append(tokens)
                sides[name]["solved"].append(float(solved))
    out: dict[str, Any] = {}
    for name, m in sides.items():
        out[name] = {"distinct_per_prompt": float(np.mean(m["distinct"])),
                     "distinct_rate": float(np.sum(m["distinct"]) / np.sum(m["rollouts"])),
                     "rollouts_per_prompt": float(np.mean(m["rollouts"])),
                     "tokens_per_prompt": float(np.mean(m["tokens"])),
                     "coverage": float(np.mean(m["solved"]))}
    out["distinct_ratio"] = out["tree"]["distinct_per_prompt"] / \
        max(out["independent"]["distinct_per_prompt"], 1e-9)
    out["settings"] = {"prompts": prompts, "n": n, "max_tokens": max_tokens,
                       "branch_prob": branch_prob, "lookahead": lookahead,
                       "min_distance": min_distance, "temperature": temperature,
                       "seeds": list(seeds), "pool": pool * n, "pool_exhausted": short,
                       "params": sum(p.numel() for p in policy.model.parameters()),
                       "seconds": time.perf_counter() - started}
    return out
