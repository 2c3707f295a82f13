"""ADHint hints scheduled by difficulty, XRPO exemplar seeding, and the marks they leave."""

from __future__ import annotations

import math

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from gfcr.core.rollout import PROMPT_SCHEMA, col, prompt_id
from gfcr.launch.run import execute
from stages import ConditionedSample, Exemplars, GroupSample, Hints, UniformSampler, Verify
from stages.generate.conditioned import EXEMPLARS, HINT_TOKENS, hint_length
from store import RolloutStore
from tests.conftest import tiny_pipeline
from tests.resources.digits import Digits
from tests.resources.rollouts import context
from tests.resources.scripted import ScriptedEngine

SCRIPT = {"A:": {"<eos>": 0.9, "1": 0.1}, "A:1": {"2": 0.5, "<eos>": 0.5}, "A:12": {"3": 1.0}}
ANSWERS = {"A:": "123", "B:": "7", "C:": "8"}


def _prompts(*texts):
    return pa.Table.from_pylist([{"prompt_id": prompt_id("t", p), "task": "t", "prompt": p,
                                  "answer": ANSWERS[p], "meta": None} for p in texts],
                                schema=PROMPT_SCHEMA)


class Task:
    def train_prompts(self):
        return _prompts("A:", "B:", "C:")


class History:
    """prompt_stats as store.LakeHistory returns it, from (attempts, successes) per prompt."""

    def __init__(self, counts):
        self.counts = {prompt_id("t", p): c for p, c in counts.items()}

    def prompt_stats(self, prompt_ids=None):
        ids = list(self.counts) if prompt_ids is None else list(prompt_ids)
        rows = []
        for pid in ids:
            a, s = self.counts.get(pid, (0, 0))
            rows.append({"prompt_id": pid, "attempts": a, "successes": s,
                         "posterior_mean": (1 + s) / (2 + a)})
        return pa.Table.from_pylist(rows)


def _generate(stage, history=None, prompts=("A:",)):
    ctx = context(task=Task(), history=history)
    return stage.generate(ctx, _prompts(*prompts), ScriptedEngine(SCRIPT), None).to_pylist()


def test_hint_length_follows_difficulty():
    assert [hint_length(10, p, 0.5, 64) for p in (0.0, 0.5, 0.9, 1.0)] == [5, 2, 0, 0]
    assert hint_length(3, 0.0, 1.0, 64) == 2  # the policy always writes the last token
    assert hint_length(10, 0.0, 1.0, 4) == 3  # and never past the length cap


def test_hard_prompts_get_hints_on_a_share_of_the_group():
    stage = ConditionedSample(sample=GroupSample(n=4, max_tokens=8), exemplars=None,
                              hints=Hints(max_ratio=1.0, share=0.5))
    rows = _generate(stage, History({"A:": (6, 0)}))  # posterior 1/8 -> floor(7/8 * 3) = 2
    assert [r[col.COMPLETION] for r in rows] == ["", "", "123", "123"]
    assert [r[HINT_TOKENS] for r in rows] == [0, 0, 2, 2]
    # forced tokens carry the policy's own logprobs, then the policy continues
    assert rows[2][col.LOGPROBS] == pytest.approx([math.log(0.1), math.log(0.5), 0.0, 0.0])
    assert rows[0][col.LOGPROBS] == pytest.approx([math.log(0.9)])


def test_easier_prompts_get_shorter_hints_and_no_history_uses_the_prior():
    stage = ConditionedSample(sample=GroupSample(n=2), exemplars=None,
                              hints=Hints(max_ratio=1.0, share=1.0))
    assert [r[HINT_TOKENS] for r in _generate(stage, History({"A:": (2, 1)}))] == [1, 1]
    assert [r[HINT_TOKENS] for r in _generate(stage, History({"A:": (98, 98)}))] == [0, 0]
    assert [r[HINT_TOKENS] for r in _generate(stage)] == [1, 1]  # default_pass 0.5


def test_failing_prompts_are_seeded_with_solved_exemplars():
    stage = ConditionedSample(sample=GroupSample(n=2), hints=None, exemplars=Exemplars(k=2, after=8))
    history = History({"A:": (8, 0), "B:": (4, 2), "C:": (4, 1)})
    rows = _generate(stage, history, prompts=("A:", "B:"))
    seeded = rows[0]
    assert seeded[col.PROMPT] in ("B:7\nC:8\nA:", "C:8\nB:7\nA:")
    assert seeded[col.PROMPT_ID] == prompt_id("t", "A:")  # history stays one series
    assert seeded[col.PROMPT_IDS] == [ord(c) for c in seeded[col.PROMPT]]
    assert [r[EXEMPLARS] for r in rows] == [2, 2, 0, 0]
    assert rows[2][col.PROMPT] == "B:"  # solved: left alone
    few = History({"A:": (7, 0), "B:": (4, 2)})
    assert _generate(stage, few)[0][EXEMPLARS] == 0  # 7 < after


def test_exemplar_seeding_reads_the_run_history_in_the_loop(tmp_path):
    stage = ConditionedSample(sample=GroupSample(n=4, max_tokens=1), hints=None,
                              exemplars=Exemplars(k=2, after=4, separator=" | "))
    p = tiny_pipeline(task=Digits(), steps=3, stages=[UniformSampler(batch=12), stage, Verify()])
    summary = execute(p, root=tmp_path, executor="local")
    with RolloutStore.open(tmp_path / "store", read_only=True) as s:
        t = s.sql(f"SELECT step, prompt, prompt_id, {EXEMPLARS} FROM rollouts "
                  f"WHERE run_id = '{summary.run_id}'")
    assert pc.max(t.filter(pc.equal(t["step"], 0))[EXEMPLARS]).as_py() == 0  # no history yet
    seeded = t.filter(pc.greater(t[EXEMPLARS], 0))
    assert seeded.num_rows > 0, "some digits prompt should fail 4 of 4 one-token samples"
    assert all(" | " in text for text in seeded["prompt"].to_pylist())
