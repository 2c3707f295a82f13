"""Tree rollouts with lookahead pruning (LATR; Xing et al. 2025, "Lookahead Tree-Based
Rollouts for Enhanced Trajectory-Level Exploration in Reinforcement Learning with
Verifiable Rewards"; code: github.com/starreeze/latr).

Independent samples of one prompt tend to differ only in a few tokens and then collapse
onto the same reasoning path. LATR grows a tree instead:

1. **Branch** where the policy is uncertain: at a position where the best token other
   than the one taken has probability ``>= branch_prob`` (LATR's absolute probability
   threshold, 0.2 in its code), start a branch with that token.
2. **Look ahead**: continue the branch ``lookahead`` tokens.
3. **Prune** a branch whose text over that window (the new token and the lookahead) is
   within normalised edit distance ``min_distance`` of its sibling's text over the same
   window (LATR's rollout filter, 0.4 in its code); survivors continue to the end.

The group of a prompt is its tree's leaves: ``n`` complete rollouts (the plan's ``n``
column overrides ``n``). Branches are opened at the earliest uncertain positions first,
the order in which LATR meets them while decoding. Pruned branches are kept in the
store with status ``pruned``. When a tree has no branch point left, the group is filled
with independent samples (new roots), as LATR mixes in stochastic samples.

Lineage: ``parent_id`` is the rollout a branch left, and the extra column ``branch_pos``
(int32, null for a root) the index in ``completion_ids`` of the branch's first own token;
``completion_ids[:branch_pos]`` is shared with the parent, so ``n_tokens - branch_pos``
tokens were generated for it (its ``new_tokens``). The shared prefix is generated once,
and its behaviour logprobs are the parent's (same policy, same step).

Partial rollouts are not continued: the pipeline refuses ``RecyclePartials`` beside this
stage (see ``continues_partials``), since a tree cannot be regrown around a path stopped
in an earlier step.

Departures: LATR branches synchronously while decoding; here a path is decoded to its
end first and its branch points are found afterwards from the top-2 logprobs the engine
reported at each position (the same distributions, so the same tree shape; see
``_policy``; the engine capability ``top_k``), and one alternative
token per position is used (LATR's ``max_n_branch_per_token=2``). On the HF engine a
branch re-prefills its prompt and shared prefix (no KV cache is shared across calls); on
an engine with prefix caching (vLLM) that prefill is nearly free.

>>> TreeRollout(n=8, branch_prob=0.2, lookahead=4, min_distance=0.4)  # doctest: +ELLIPSIS
TreeRollout(name=None, type='latr', n=8, branch_prob=0.2, lookahead=4, min_distance=0.4, ...)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import pyarrow as pa
from pydantic import Field

from gfcr.core.engine import (Decision, Engine, GenOutput, GenRequest, Inflight, SamplingParams,
                              SegmentHook, encode_prompt)
from gfcr.core.rollout import PLAN_MAX_TOKENS, PLAN_N, col
from gfcr.core.stage import StageSpec, StepContext
from gfcr.core.registry import register
from stages.generate._policy import BranchPoint, branch_points
from stages.generate.group import GENERATED
from stages.generate.rows import Made, rollout_row, single_turn, stable_id, to_table

BRANCH_POS = "branch_pos"
"""Extra column: index of a branch's first own token in ``completion_ids`` (null: root)."""

_MAX_ROUNDS = 32
"""Branching rounds per step before the remaining slots are filled by plain samples."""


@register("generate")
class TreeRollout(StageSpec):
    """LATR tree rollouts: branch where uncertain, look ahead, prune look-alikes."""

    type: Literal["latr"] = "latr"
    n: int = Field(8, ge=1)
    """Finished paths (leaves) wanted per prompt: the group size."""
    branch_prob: float = Field(0.2, gt=0.0, lt=1.0)
    """Branch at a token where another token has at least this probability."""
    lookahead: int = Field(4, ge=1)
    """Tokens a new branch is continued before it is compared with its sibling."""
    min_distance: float = Field(0.4, ge=0.0, le=1.0)
    """Prune a branch whose lookahead window is within this normalised edit distance of its
    sibling's."""
    temperature: float = Field(1.0, ge=0.0)
    """Sampling temperature of every path."""
    max_tokens: int = Field(16, ge=1)
    """Completion tokens per path."""
    stop: tuple[str, ...] = ()
    """A path ends after it produces any of these strings (besides EOS)."""

    writes: ClassVar[frozenset[str]] = GENERATED | {BRANCH_POS}
    continues_partials: ClassVar[bool] = False
    engine_needs: ClassVar[frozenset[str]] = frozenset({"segments", "continuation", "top_k"})
    """A tree is grown, branched and pruned within one step, from paths decoded to their
    end; a stopped path cannot be brought back into its tree in a later step, so the
    pipeline refuses ``RecyclePartials`` (and so APRIL or a stopping token budget) with it."""

    def sampling_temperature(self) -> float:
        """The temperature this stage samples at (a train stage's ratio must match it)."""
        return self.temperature

    def plan_defaults(self) -> dict[str, int]:
        """A plan row without its own ``n`` or ``max_tokens`` gets these."""
        return {PLAN_N: self.n, PLAN_MAX_TOKENS: self.max_tokens}

    def generate(self, ctx: StepContext, plan: pa.Table, engine: Engine,
                 on_segment: SegmentHook | None) -> pa.Table:
        tree = _Forest(self, ctx, plan.to_pylist(), engine, on_segment)
        tree.grow()
        return tree.table()


@dataclass
class _Node:
    prompt: int
    idx: int
    parent: int | None = None
    point: BranchPoint | None = None
    out: GenOutput | None = None
    checked: bool = False

    @property
    def leaf(self) -> bool:
        return self.out is not None and self.out.finish_reason in ("stop", "length")


@dataclass
class _Forest:
    """The trees of one step's prompts, grown round by round in batched engine calls."""

    spec: TreeRollout
    ctx: StepContext
    prompts: list[dict[str, Any]]
    engine: Engine
    hook: SegmentHook | None
    nodes: list[list[_Node]] = field(default_factory=list)
    frontier: list[list[tuple[int, _Node, BranchPoint]]] = field(default_factory=list)
    pending: dict[int, _Node] = field(default_factory=dict)
    keys: int = 0

    def __post_init__(self) -> None:
        self.ids = [encode_prompt(self.engine, p[col.PROMPT]) for p in self.prompts]
        self.width = [self.spec.n if p.get("n") is None else int(p["n"]) for p in self.prompts]
        self.nodes = [[] for _ in self.prompts]
        self.frontier = [[] for _ in self.prompts]

    def grow(self) -> None:
        for round_ in range(_MAX_ROUNDS + 1):
            batch = [self._plan(p, branch=round_ < _MAX_ROUNDS) for p in range(len(self.prompts))]
            todo = [node for nodes in batch for node in nodes]
            if not todo:
                return
            self._run(todo, round_)

    def _plan(self, p: int, *, branch: bool) -> list[_Node]:
        """New nodes for prompt ``p``: branches at its earliest open points, or roots."""
        need = self.width[p] - sum(n.leaf for n in self.nodes[p])
        if need <= 0:
            return []
        made: list[_Node] = []
        if branch and self.frontier[p]:
            self.frontier[p].sort(key=lambda f: (f[0], -f[2].prob))
            for _, parent, point in self.frontier[p][:need]:
                made.append(_Node(p, len(self.nodes[p]) + len(made), parent.idx, point))
            del self.frontier[p][:need]
            self.nodes[p].extend(made)
            return made
        if branch:
            need = 1  # no open branch point: one fresh root, then branch from it
        made = [_Node(p, len(self.nodes[p]) + i) for i in range(need)]
        self.nodes[p].extend(made)
        return made

    def _run(self, todo: list[_Node], round_: int) -> None:
        requests = [self._request(node) for node in todo]
        seed = int(self.ctx.rng(f"{self.spec.label}/{round_}").integers(2**31 - 1))
        params = SamplingParams(temperature=self.spec.temperature, max_tokens=self.spec.max_tokens,
                                stop=self.spec.stop, segment_tokens=self.spec.lookahead,
                                seed=seed, top_logprobs=2)  # top 2: branch points (_open)
        outputs = self.engine.generate(requests, params, self)  # self: the SegmentHook
        for node, out in zip(todo, outputs):
            node.out = out
            if node.point is not None and node.leaf and not node.checked:
                node.checked = True  # finished inside the lookahead window
                if self._similar(node, out.completion_ids):
                    out.finish_reason = "pruned"
        self.pending.clear()
        self._open([n for n in todo if n.leaf])

    def _request(self, node: _Node) -> GenRequest:
        self.keys += 1
        prompt = self.prompts[node.prompt]
        prefix: list[int] = []
        logprobs: list[float] = []
        if node.point is not None:
            parent = self._parent_out(node)
            at = node.point.pos
            prefix = parent.completion_ids[:at] + [node.point.token]
            logprobs = parent.logprobs[:at] + [node.point.logprob]
            self.pending[self.keys] = node
        return GenRequest(key=self.keys, prompt_ids=self.ids[node.prompt], prefix_ids=prefix,
                          prefix_logprobs=logprobs, max_tokens=prompt.get("max_tokens"))

    def wave(self, keys: list[int]) -> None:
        """SegmentHook: the engine's wave announcements go on to the pipeline's hooks."""
        if self.hook is not None:
            self.hook.wave(keys)

    def expect(self, groups: dict[int, str]) -> None:
        """SegmentHook: trees declare no groups to the pipeline's hooks."""

    def __call__(self, inflight: list[Inflight]) -> dict[int, Decision]:
        """SegmentHook: prune branches too close to their sibling, then the pipeline's."""
        return self._on_segment(inflight)

    def _on_segment(self, inflight: list[Inflight]) -> dict[int, Decision]:
        decisions: dict[int, Decision] = {}
        for view in inflight:
            node = self.pending.get(view.key)
            if node is not None and not node.checked and view.new_tokens >= self.spec.lookahead:
                node.checked = True
                if self._similar(node, view.completion_ids):
                    decisions[view.key] = "prune"
        for key, decision in ((self.hook(inflight) or {}) if self.hook else {}).items():
            if decisions.get(key) != "prune":
                decisions[key] = decision
        return decisions

    def _parent_out(self, node: _Node) -> GenOutput:
        """The finished output of the branch ``node`` grows from."""
        out = self.nodes[node.prompt][node.parent].out  # type: ignore[index]
        if out is None:
            raise RuntimeError(f"tree: branch {node!r} opened before its parent finished")
        return out

    def _similar(self, node: _Node, ids: list[int]) -> bool:
        """Whether the branch's window stays within ``min_distance`` of its sibling's."""
        at = node.point.pos  # type: ignore[union-attr]
        window = ids[at:at + 1 + self.spec.lookahead]
        parent = self._parent_out(node)
        sibling = parent.completion_ids[at:at + len(window)]
        decode = self.engine.decode
        return edit_ratio(decode(window), decode(sibling)) < self.spec.min_distance

    def _open(self, leaves: list[_Node]) -> None:
        """Find the new leaves' branch points and add them to their trees' frontiers."""
        if not leaves:
            return
        starts = [0 if n.point is None else n.point.pos + 1 for n in leaves]
        try:
            points = branch_points([n.out for n in leaves], starts,  # type: ignore[misc]
                                   min_prob=self.spec.branch_prob)
        except TypeError as err:
            raise TypeError(f"stage {self.spec.label!r}: {err}") from None
        for node, found in zip(leaves, points):
            self.frontier[node.prompt].extend((bp.pos, node, bp) for bp in found)

    def table(self) -> pa.Table:
        rows, branch = [], []
        for p, nodes in enumerate(self.nodes):
            group = stable_id(self.ctx.run_id, self.ctx.step, self.ctx.round, "group", p)
            for node in nodes:
                parent = None if node.parent is None else \
                    stable_id(self.ctx.run_id, self.ctx.step, group, node.parent)
                out: Any = node.out
                pos = None if node.point is None else node.point.pos
                traj = single_turn(self.ids[p], out.completion_ids, out.logprobs)
                made = Made(out.version_start, out.version_end, out.finish_reason,
                            out.seconds, out.server)
                rows.append(rollout_row(self.ctx, self.prompts[p], group, node.idx, traj, made,
                                        self.engine, parent_id=parent,
                                        new_tokens=len(out.completion_ids) - (pos or 0)))
                branch.append(pos)
        table = to_table(rows)
        return table.append_column(pa.field(BRANCH_POS, pa.int32()), pa.array(branch, pa.int32()))


def edit_ratio(a: str, b: str) -> float:
    """Levenshtein distance divided by the longer length: 0 = equal, 1 = nothing shared."""
    if a == b:
        return 0.0
    if not a or not b:
        return 1.0
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1] / max(len(a), len(b))
