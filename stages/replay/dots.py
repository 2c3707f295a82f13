"""DOTS: difficulty-targeted online data selection.

The DOTS half of DOTS+RR ("Improving Data Efficiency for LLM Reinforcement Fine-tuning
Through Difficulty-targeted Online Data Selection and Rollout Replay", 2025; code at
github.com/ASTRAL-Group/data-efficient-llm-rl): prioritise prompts whose *adaptive
difficulty* — the current policy's pass rate — is closest to 1/2, where a GRPO group
carries the most signal. Only a small reference set is ever measured; every other
prompt's pass rate is predicted from its similarity to the reference prompts.

Here the reference set costs no extra rollouts: it is the ``reference`` most recently
attempted prompts of the run, with their (discounted) pass rates read from the store as
of the previous step. A prompt's predicted pass rate is the attention-style average of
the reference pass rates, weighted by ``softmax(cosine / temperature)``; a prompt the run
has attempted itself updates that prediction with its own evidence (the prediction is
its prior, of strength 2). Each step scores ``candidates`` pool prompts drawn at random
plus every prompt attempted before, and takes the ``batch`` nearest to ``target``.

Departure: the paper embeds prompts with a pretrained encoder and learns the attention;
here the embedding is a character 1-3-gram TF-IDF vector and the similarity its cosine
(nothing to download or train, deterministic), which suits templated procedural tasks.

>>> DOTS(batch=16, target=0.5, candidates=512, reference=256)  # doctest: +ELLIPSIS
DOTS(name=None, type='dots', batch=16, target=0.5, candidates=512, reference=256, ...)
"""

from __future__ import annotations

from collections import Counter
from typing import ClassVar, Literal

import numpy as np
import pyarrow as pa
from pydantic import Field, PrivateAttr

from gfcr.core.rollout import PROMPT_COLUMNS, col
from gfcr.core.stage import StageSpec, StepContext
from gfcr.core.registry import register
from stages.replay import _beliefs, _reads

NGRAMS = (1, 2, 3)
"""Character n-gram lengths of the TF-IDF vectors."""
OWN_STRENGTH = 2.0
"""Pseudo-attempts the similarity prediction weighs against a prompt's own attempts."""


@register("replay")
class DOTS(StageSpec):
    """Pick the prompts whose predicted pass rate is nearest ``target`` (module doc)."""

    type: Literal["dots"] = "dots"
    batch: int = Field(16, ge=1)
    """Prompts per step."""
    target: float = Field(0.5, gt=0.0, lt=1.0)
    """Pass rate to aim at (1/2 maximises the reward variance of a group)."""
    candidates: int = Field(512, ge=1)
    """Random pool prompts scored per step, besides every prompt attempted before."""
    reference: int = Field(256, ge=1)
    """Most recently attempted prompts whose pass rates the predictions are made from."""
    temperature: float = Field(0.1, gt=0.0)
    """Softmax temperature over cosine similarities (smaller: nearest prompts only)."""
    half_life: float | None = Field(8.0, gt=0.0)
    """Discount attempts older than this many steps by half (None: keep all)."""

    writes: ClassVar[frozenset[str]] = PROMPT_COLUMNS
    _grams: dict[str, Counter] = PrivateAttr(default_factory=dict)

    def select(self, ctx: StepContext, chosen: pa.Table) -> pa.Table:
        missing = _beliefs.wanted(ctx, chosen, self.batch)
        if missing <= 0:
            return chosen
        prompts = _beliefs.pool(ctx, self.label)
        rng = ctx.rng(self.label)
        evidence = (_reads.prompt_evidence(ctx.history, now=ctx.step, half_life=self.half_life)
                    if ctx.history is not None else None)
        ids = prompts.column(col.PROMPT_ID).to_pylist()
        tried = set() if evidence is None else set(evidence.column("prompt_id").to_pylist())
        sample = rng.choice(len(ids), size=min(self.candidates, len(ids)), replace=False)
        rows = sorted(set(sample.tolist()) | {i for i, p in enumerate(ids) if p in tried})
        cands = prompts.take(pa.array(rows, pa.int64()))
        predicted = self.predict(cands, prompts, evidence)
        return _beliefs.pick(chosen, cands, -np.abs(predicted - self.target), missing, rng)

    def predict(self, cands: pa.Table, prompts: pa.Table, evidence: pa.Table | None) -> np.ndarray:
        """Predicted pass rate of each candidate (1/2 while the run has no evidence)."""
        if evidence is None or evidence.num_rows == 0:
            return np.full(cands.num_rows, 0.5)
        p0 = _reads.global_rate(evidence)
        text = dict(zip(prompts.column(col.PROMPT_ID).to_pylist(),
                        prompts.column(col.PROMPT).to_pylist()))
        ids = evidence.column("prompt_id").to_pylist()
        recent = np.argsort(-evidence.column("last_step").to_numpy(), kind="stable")
        ref = [int(i) for i in recent if ids[i] in text][:self.reference]
        cand_ids = cands.column(col.PROMPT_ID).to_pylist()
        own_n, own_s = _beliefs.evidence_for(cand_ids, evidence)
        if not ref:
            return (own_s + OWN_STRENGTH * p0) / (own_n + OWN_STRENGTH)
        n, s = evidence.column("n").to_numpy()[ref], evidence.column("s").to_numpy()[ref]
        rate = (s + OWN_STRENGTH * p0) / (n + OWN_STRENGTH)
        sim = self._cosine(cands.column(col.PROMPT).to_pylist(), [text[ids[i]] for i in ref])
        sim[np.equal.outer(np.array(cand_ids), np.array([ids[i] for i in ref]))] = -1.0  # not itself
        attn = np.exp((sim - sim.max(axis=1, keepdims=True)) / self.temperature)
        prior = (attn / attn.sum(axis=1, keepdims=True)) @ rate
        return (own_s + OWN_STRENGTH * prior) / (own_n + OWN_STRENGTH)

    def _cosine(self, left: list[str], right: list[str]) -> np.ndarray:
        """Cosine similarity of TF-IDF vectors (IDF fitted on both sides together), in
        float64: in float32 the BLAS kernel a CPU picks changed the last bits, and with
        them which of two near-equal candidates was drawn (see ``_beliefs.pick``)."""
        docs = [self._ngrams(t) for t in left + right]
        vocab = {g: i for i, g in enumerate(sorted(set().union(*docs)))}
        counts = np.zeros((len(docs), len(vocab)), dtype=np.float64)
        for d, grams in enumerate(docs):
            for g, c in grams.items():
                counts[d, vocab[g]] = 1.0 + np.log(c)
        df = (counts > 0).sum(axis=0)
        vec = counts * np.log((1.0 + len(docs)) / (1.0 + df))
        vec /= np.maximum(np.linalg.norm(vec, axis=1, keepdims=True), 1e-12)
        return vec[:len(left)] @ vec[len(left):].T

    def _ngrams(self, text: str) -> Counter:
        if text not in self._grams:
            padded = f" {' '.join(text.split())} "
            self._grams[text] = Counter(padded[i:i + k] for k in NGRAMS
                                        for i in range(len(padded) - k + 1))
        return self._grams[text]
