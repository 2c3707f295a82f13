"""Task components: procedural reasoning-gym datasets and JSON-lines files.

:class:`ReasoningGym` wraps a reasoning-gym dataset (Stojanovski et al. 2025, "REASONING
GYM: Reasoning Environments for Reinforcement Learning with Verifiable Rewards") whose own
scorer is the verifier; :class:`JsonlTask` reads prompts and answers from a file.

>>> task = ReasoningGym(dataset="chain_sum", train_size=100, heldout_size=20)
>>> row = task.heldout_prompts().to_pylist()[0]
>>> task.score(row["answer"], row["answer"], row["meta"])
1.0
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Literal

import math_verify
import pyarrow as pa
import reasoning_gym
from pydantic import Field, PrivateAttr, model_validator
from reasoning_gym.composite import DatasetSpec
from reasoning_gym.factory import DATASETS

from gfcr.core.rollout import PROMPT_SCHEMA, prompt_id
from gfcr.core.stage import Spec
from gfcr.core.registry import register
from stages.tasks._readers import DataFileError, read

_HELDOUT_SEED_OFFSET = 1_000_003
"""The held-out split is drawn from seed + this offset, then stripped of training prompts."""
_DRAWS_PER_PROMPT = 20
"""Give up after this many draws per requested distinct prompt (a task too small)."""
_PATIENCE = 1000
"""Give up, too, once ``_PATIENCE + 2 * found`` draws in a row gave no new prompt: the
problem space is exhausted (a size it cannot supply fails in seconds, not hours)."""
_MAX_PROMPTS = 1_000_000
"""Most prompts a split may ask for (a million draws take about ten minutes)."""


@register("task")
class ReasoningGym(Spec):
    """A reasoning-gym dataset as a task: training and held-out prompt tables, and the
    dataset's own ``score_answer`` as the scorer.

    Both splits hold distinct prompts; the held-out split is drawn under another seed and
    never contains a training prompt, so with a small problem space (e.g. one-digit sums)
    it is biased towards the rarer, harder problems. The scorer gets the completion
    stripped of surrounding whitespace (no ``<answer>`` tag extraction).
    """

    type: Literal["reasoning_gym"] = "reasoning_gym"
    dataset: str = "chain_sum"
    """The reasoning-gym dataset's name (``reasoning_gym.factory.DATASETS``)."""
    config: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments of ``reasoning_gym.create_dataset`` (not seed or size); a key left
    out takes the dataset's own default, so ``{}`` is the dataset as reasoning-gym ships it.
    ``composite`` mixes datasets: ``{"datasets": [{"name": ..., "weight": ..., "config":
    {...}}, ...]}``; its rows' ``task`` column names the member dataset each was drawn from."""
    train_size: int = Field(4000, ge=1, le=_MAX_PROMPTS)
    """Distinct training prompts drawn."""
    heldout_size: int = Field(256, ge=1, le=_MAX_PROMPTS)
    """Distinct held-out prompts drawn (none of them a training prompt)."""
    seed: int = 0
    """Seed of the training draw; the held-out draw uses a seed derived from it."""

    _cache: dict[str, Any] = PrivateAttr(default_factory=dict)

    @model_validator(mode="after")
    def _check(self) -> "ReasoningGym":
        if self.dataset not in DATASETS:
            raise ValueError(f"dataset {self.dataset!r} is not a reasoning-gym dataset; "
                             f"known: {', '.join(sorted(DATASETS))}")
        config_cls = DATASETS[self.dataset][1]
        fields = {f.name for f in dataclasses.fields(config_cls)} - {"seed", "size"}
        unknown = sorted(set(self.config) - fields)
        if unknown:
            raise ValueError(f"config keys {unknown!r} are not options of {self.dataset!r} "
                             f"({config_cls.__name__}); known: {', '.join(sorted(fields))}")
        try:
            self._dataset(self.seed, 1)
        except (AssertionError, TypeError, ValueError) as err:
            raise ValueError(f"config {self.config!r} is invalid for {self.dataset!r}: "
                             f"{err}") from None
        return self

    def prompt_counts(self) -> dict[str, int]:
        """The prompts each split holds (gfcr.core.sizes checks a pipeline's demands on them)."""
        return {"train": self.train_size, "heldout": self.heldout_size}

    def _dataset(self, seed: int, size: int) -> Any:
        return reasoning_gym.create_dataset(self.dataset, **_specs(self.config), seed=seed,
                                            size=size)

    def train_prompts(self) -> pa.Table:
        """``train_size`` distinct prompts drawn under ``seed`` (PROMPT_SCHEMA)."""
        if "train" not in self._cache:
            rows = self._draw(self.seed, self.train_size, exclude=set(), field="train_size")
            self._cache["train"] = pa.Table.from_pylist(rows, schema=PROMPT_SCHEMA)
        return self._cache["train"]

    def heldout_prompts(self) -> pa.Table:
        """``heldout_size`` distinct prompts, none of them a training prompt."""
        if "heldout" not in self._cache:
            exclude = set(self.train_prompts().column("prompt_id").to_pylist())
            rows = self._draw(self.seed + _HELDOUT_SEED_OFFSET, self.heldout_size,
                              exclude=exclude, field="heldout_size")
            self._cache["heldout"] = pa.Table.from_pylist(rows, schema=PROMPT_SCHEMA)
        return self._cache["heldout"]

    def score(self, completion: str, answer: str | None, meta: str | None) -> float:
        """The dataset's ``score_answer`` on the stripped completion, in [0, 1].

        Partial credit: many reasoning-gym scorers give less than 1 to an answer that is
        wrong but well-formed or close (e.g. 0.05 for a grid of the right shape in
        ``arc_agi``, 0.01 for a parsable but wrong move list in ``rush_hour``, a share of
        the correct items in list answers); 1.0 only for a right answer. ``Verify(
        full_credit_only=True)`` turns every reward below 1 into 0. The entry is the one
        drawn in this process when there is one (scorers compare Python values, e.g.
        tuples, that the JSON in ``meta`` turns into lists), else ``meta`` parsed."""
        entry = json.loads(meta) if meta else {}
        drawn = self._cache.get("entries", {}).get(
            prompt_id(self.dataset, str(entry.get("question"))))
        entry = drawn if drawn is not None else entry
        if answer is not None:
            entry.setdefault("answer", answer)
        return float(self._scorer().score_answer(completion.strip(), entry))

    def _scorer(self) -> Any:
        if "scorer" not in self._cache:
            self._cache["scorer"] = self._dataset(self.seed, 1)
        return self._cache["scorer"]

    def _draw(self, seed: int, size: int, *, exclude: set[str], field: str) -> list[dict]:
        limit = _DRAWS_PER_PROMPT * size + 1000
        dataset = self._dataset(seed, limit)
        rows: list[dict] = []
        seen, since_new = set(exclude), 0
        for idx in range(limit):
            entry = dataset[idx]
            pid = prompt_id(self.dataset, entry["question"])
            if pid in seen:
                since_new += 1
                if since_new > _PATIENCE + 2 * len(rows):
                    raise ValueError(f"{field}={size!r}: {self.dataset!r} with config "
                                     f"{self.config!r} gave only {len(rows)} distinct new "
                                     f"prompts; the last {since_new} draws gave none (lower "
                                     f"{field} or widen the config)")
                continue
            seen.add(pid)
            since_new = 0
            self._cache.setdefault("entries", {})[pid] = entry
            reference = entry.get("answer")  # None: the scorer checks a solution's validity
            rows.append({"prompt_id": pid, "task": _source(self.dataset, entry),
                         "prompt": entry["question"],
                         "answer": None if reference is None else str(reference),
                         "meta": json.dumps(entry, default=str)})
            if len(rows) == size:
                return rows
        raise ValueError(f"{field}={size!r}: {self.dataset!r} with config {self.config!r} gave "
                         f"only {len(rows)} distinct new prompts in {limit} draws")


def _specs(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` with a composite's ``datasets`` (JSON objects ``{"name", "weight",
    "config"}``, as a spec file holds them) made reasoning-gym's ``DatasetSpec``s."""
    mixed = config.get("datasets")
    if not isinstance(mixed, list):
        return config
    specs = [d if isinstance(d, DatasetSpec) else DatasetSpec(**d) for d in mixed]
    return {**config, "datasets": specs}


def _source(dataset: str, entry: dict[str, Any]) -> str:
    """The ``task`` column of a drawn entry: a composite's member dataset (so per-task
    views split a mixture), else the dataset's name."""
    if dataset != "composite":
        return dataset
    return str(entry.get("metadata", {}).get("source_dataset", dataset))


# --------------------------------------------------------------------------- jsonl


@register("task")
class JsonlTask(Spec):
    """Prompts and reference answers from a JSON-lines file, one object per line with
    ``prompt`` and ``answer`` (and optionally ``meta``, any JSON value).

    The held-out split is either a second file (``heldout_path``; its prompts are removed
    from training) or a stable ``heldout_fraction`` chosen by prompt-id hash. Duplicate
    prompts are kept once. Scorers: ``exact`` (stripped strings equal) or ``math``
    (math-verify: the parsed completion is equivalent to the parsed answer).

    >>> JsonlTask(path="data/gsm8k.jsonl", heldout_fraction=0.1, scorer="math")  # doctest: +SKIP
    """

    type: Literal["jsonl"] = "jsonl"
    path: str
    """The JSON-lines file of training (and, with heldout_fraction, held-out) prompts."""
    heldout_path: str | None = None
    """A second JSON-lines file of held-out prompts (removed from training)."""
    heldout_fraction: float | None = Field(None, gt=0.0, lt=1.0)
    """Share of the prompts held out, chosen stably by prompt-id hash."""
    scorer: Literal["exact", "math"] = "exact"
    """``exact``: stripped strings equal; ``math``: math-verify equivalence."""

    _cache: dict[str, Any] = PrivateAttr(default_factory=dict)

    @model_validator(mode="after")
    def _one_heldout(self) -> "JsonlTask":
        if (self.heldout_path is None) == (self.heldout_fraction is None):
            raise ValueError(f"jsonl: give exactly one of heldout_path ({self.heldout_path!r}) "
                             f"and heldout_fraction ({self.heldout_fraction!r})")
        return self

    @property
    def name(self) -> str:
        """The task name in the ``task`` column: the file's stem."""
        return Path(self.path).stem

    def train_prompts(self) -> pa.Table:
        return self._splits()[0]

    def heldout_prompts(self) -> pa.Table:
        return self._splits()[1]

    def score(self, completion: str, answer: str | None, meta: str | None) -> float:
        if answer is None:
            raise ValueError("jsonl: cannot score a prompt without a reference answer")
        if self.scorer == "exact":
            return float(completion.strip() == answer.strip())
        gold = math_verify.parse(answer, parsing_timeout=None)
        pred = math_verify.parse(completion, parsing_timeout=None)
        return float(math_verify.verify(gold, pred, timeout_seconds=None))

    def _splits(self) -> tuple[pa.Table, pa.Table]:
        if "splits" not in self._cache:
            rows = _read_jsonl(Path(self.path), self.name)
            if self.heldout_path is not None:
                heldout = _read_jsonl(Path(self.heldout_path), self.name)
                held_ids = {r["prompt_id"] for r in heldout}
                train = [r for r in rows if r["prompt_id"] not in held_ids]
            else:
                cut = int(self.heldout_fraction * 2**64)  # type: ignore[operator]
                held = [int(r["prompt_id"], 16) < cut for r in rows]
                train = [r for r, h in zip(rows, held) if not h]
                heldout = [r for r, h in zip(rows, held) if h]
            self._cache["splits"] = (pa.Table.from_pylist(train, schema=PROMPT_SCHEMA),
                                     pa.Table.from_pylist(heldout, schema=PROMPT_SCHEMA))
        return self._cache["splits"]


def _read_jsonl(path: Path, task: str) -> list[dict]:
    """Distinct prompt rows of a JSON-lines file; ValueError names file, line and key
    (read by stages.tasks._readers, as FileTask reads one)."""
    if not path.is_file():
        raise FileNotFoundError(f"jsonl: path {str(path)!r} is not a file")
    rows: list[dict] = []
    seen: set[str] = set()
    for row in read(path, "jsonl", ("prompt", "answer")):
        obj = row.values
        for key in ("prompt", "answer"):
            if obj[key] is None:
                raise DataFileError(f"{row.where}: column {key!r} is empty")
        pid = prompt_id(task, str(obj["prompt"]))
        if pid in seen:
            continue
        seen.add(pid)
        meta = obj.get("meta")
        rows.append({"prompt_id": pid, "task": task, "prompt": str(obj["prompt"]),
                     "answer": str(obj["answer"]),
                     "meta": None if meta is None else json.dumps(meta)})
    return rows
