"""SmolLM2 learns to use a Python tool: multi-turn episodes against ``python_tool``.

SmolLM2-135M-Instruct (pipelines/smol.py; its own ChatML template) is asked two-term
sums and differences of 3-4 digit numbers from reasoning-gym's ``chain_sum`` ("State
the final answer to the following arithmetic problem: 4821 - 967 ="), which it gets
wrong in its head. The ``python_tool`` environment (stages/envs/python_tool.py) declares
the Python tool in its system message; a reply with
``<tool_call>{"name": "python", "arguments": {"code": ...}}</tool_call>`` runs the code
in the bubblewrap sandbox and the output comes back as a ``tool`` turn (out of the
loss); a reply without a call is the final answer, rewarded 1 when its last number is
the reference. Up to two policy turns: a call, then the answer.

Warm start: supervised on demonstration episodes (stages/envs/python_demos.py: call
``print(<expression>)``, read the output, answer), the tool turn masked
(stages/train/sft_demos.py), so the model emits well-formed calls before GRPO. Half the
demonstrations answer at once without the tool (``python_half``), so GRPO has a choice
to learn. On 64 validation prompts (bench/agentic_real.py --split val, one seed,
episodes sampled at temperature 1) the warm start calls the tool in 31% of episodes and
is right in 30% (its in-head answers are wrong); after 8 GRPO steps of 4 prompts x 4
episodes it calls the tool in 100% and is right in 97%, at lr 1e-5 and at 3e-5 alike.
Greedily it calls the tool on 31 of 32 validation prompts already. With demonstrations
that all call it, 6 warm-start steps made every greedy and nearly every sampled episode
call it, leaving GRPO nothing to learn but fewer garbled calls at temperature 1. Every
step stores the tool-call rate, tool-error rate and success (``tool/*`` metrics,
gfcr.runner.tool_metrics) and the report charts them.

The held-out evaluation the run itself prints is the task's single-turn greedy accuracy
(no tool: what the model does in its head); bench/agentic_real.py measures held-out
episode success with the tool, before and after GRPO, on both engines.

Steps, batch and lr are the validation probes' (BENCHMARKS.md, "SmolLM2 with a Python
tool", says what was tried).

Cost here (2 cores, loaded by other jobs): the warm start about 10 minutes once
(cached), a GRPO step of 4 prompts x 4 episodes 30-60 s: about 15 minutes a run.
"""

from gfcr import Evaluation, Pipeline
from stages import GRPO, HF, SFT, Episodes, ReasoningGym, SmolLM2, UniformSampler

task = ReasoningGym(dataset="chain_sum", train_size=400, heldout_size=512,
                    config={"min_terms": 2, "max_terms": 2, "min_digits": 3, "max_digits": 4})
"""Held-out: 512 prompts; bench/agentic_real.py chooses on the first 256 (validation)
and reports on the other 256."""

DEMOS = "stages.envs.python_demos:python_half"
"""The demonstration episodes of the warm start: half call the tool, half answer at once
(with every demonstration a call, 6 steps already made every sampled episode call it)."""

SETUP = dict(task=task, policy=SmolLM2(), engine=HF(device="cpu"),
             warmstart=SFT(steps=12, batch_size=8, lr=3e-5, schedule="cosine",
                           demonstrations=DEMOS),
             evaluation=Evaluation(size=16, max_tokens=16))
"""Task, policy, engine, warm start and evaluation (pipelines/smol_agent_openai.py and
bench/agentic_real.py share them)."""

EPISODES = dict(n=4, temperature=1.0, max_turns=2, max_tokens=48, max_episode_tokens=128)
"""Episodes per task, sampling and lengths: a call is about 40 tokens, an answer 3-6."""

LR = 1e-5
"""GRPO's learning rate (smol's 3e-6 barely moved the policy: issue 32)."""

pipeline = Pipeline(
    name="smol-agent",
    seed=0,
    steps=8,
    **SETUP,
    stages=[
        UniformSampler(batch=4),
        Episodes(env="python_tool", **EPISODES),
        GRPO(lr=LR, micro_batch=8),
    ],
)
