"""Long answers on a real model: GRPO on SmolLM2-135M-Instruct sorting lists, on a CPU.

The task is a reasoning-gym mixture (``composite``): 85% ``number_sorting`` (3-5
integers from -99 to 99, ascending or descending, answered as a list of strings:
``['-49.0', '12.0', '66.0']``, 25-45 tokens) and 15% ``word_sorting`` (25-35 words by
ASCII order, 70-100 tokens), each scored by its dataset's own exact scorer. The mixture
gives what the length-dependent operators need: a median completion of about 26 tokens
and a long tail (p90 128 greedy after the warm start: the long lists, and the answers
that repeat until ``max_tokens``), so APRIL's partial rollouts, overlong shaping and
pruning have something to act on (bench/real_long.py, BENCHMARKS.md "Long answers").

Why this warm start: the base model answers in sentences and repeats the prompt's
instructions (0% on 96 held-out prompts, 96% of them cut at 128 tokens); 50 supervised
steps of 8 reference answers (lr 5e-5, cosine) teach the list format, after which it is
right on 17% of held-out prompts greedily (64 prompts): its usual mistake is an order
that is almost right, so a group of 4 samples often has signal. Tried first: list
reversal (``word_sequence_reversal``, 11-16 words; answers of 24-40 tokens with a short
prompt): 0% after 40 warm-start steps of 16, the answers collapsing into repeated words.

Why Dr. GRPO at lr 1e-5: chosen on the validation split (task seed 1: its own training
and held-out prompts, the same warm start; greedy; the figures reported are on task seed
0's held-out prompts, which chose nothing). From 18.0% after the warm start (128
prompts), 8 steps of GRPO at 3e-5 went to 6.3% and at 1e-4 to 0%; Dr. GRPO (Liu et al.
2025: the group mean subtracted, no division by the group's std) at 3e-5 to 3.9% and at
1e-5 to 22.7%. Divided by a group's std, the word lists' partial credit (0.03 beside
three 0.0) becomes as large an advantage as a right answer; Dr. GRPO leaves it at 0.03.

Why ListOrder's reward and 16 steps: scored exactly, a number list earns nothing unless
it is entirely right, and the model's mistakes are orders that are almost right, so only
7 of 16 groups of 8 samples carry a signal; crediting half the share of pairs in order
(:class:`stages.filter.list_order.ListOrder`) gives 12 of 16 a signal that points toward
better orders. On 256 validation prompts (19.1% after the warm start, one seed), Dr.
GRPO at 1e-5 with the exact reward went to 23.0% at step 8 and back to 15.2% at step 16;
with ListOrder's to 23.4% and 25.8% (+6.6, paired standard error 2.4). The 8-step exact
recipe's validation gain had not held on the held-out prompts (-0.4 +- 2.4 points on the
HF engine, -2.6 +- 1.2 on vLLM, 3 seeds); with 8 prompts a step this one's held out at
+1.7 points on HF and +0.7 +- 1.5 on vLLM: better, still within the prompts' noise.

Why 16 prompts a step: with 8 prompts x 4 samples two GRPO seeds landed 10 points apart
on the same 128 validation prompts (+4.7, -5.5), a gradient too noisy for lr 1e-5 to
follow (lr 2e-5 lost 5.5); 16 prompts x 4, the same 16 updates, gained on each of 3
validation seeds (+8.6, +3.9, +10.9). Held out (task seed 0's 256 prompts, 3 seeds an
engine, from 19.1%): +3.0 points on HF (seeds +4.3, +0.4, +4.3; standard error 1.3) and
+6.3 on vLLM (+3.5, +5.5, +9.8; 1.8). BENCHMARKS.md ("Long answers on SmolLM2") has
what was tried.

Cost here (2 cores, one run at a time): the warm start about 7 minutes (15 at moderate
load; once, cached), a GRPO step of 16 prompts x 4 samples of up to 128 tokens 67-108 s
on the HF engine and 24-40 s on vLLM; a run with its two 256-prompt evaluations 32-35
minutes on HF, 11 on vLLM.
"""

from gfcr import Evaluation, Pipeline
from stages import (GRPO, HF, SFT, DynamicSampling, GroupSample, ListOrder, ReasoningGym,
                    SmolLM2, UniformSampler, Verify)

SYSTEM = "Reply with only the sorted list."
"""The system message (replacing the template's "You are a helpful AI assistant...")."""

NUMBERS = {"min_numbers": 3, "max_numbers": 5, "min_decimals": 0, "max_decimals": 0,
           "min_value": -99, "max_value": 99}
WORDS = {"min_words": 25, "max_words": 35}
MIX = {"datasets": [{"name": "number_sorting", "weight": 0.85, "config": NUMBERS},
                    {"name": "word_sorting", "weight": 0.15, "config": WORDS}]}
"""The mixture: mostly short lists of numbers, a tail of long lists of words."""

task = ReasoningGym(dataset="composite", train_size=2000, heldout_size=256, config=MIX)

MAX_TOKENS = 128
"""Completion cap: above every reference answer (the longest of 400 drawn: 80 tokens)."""

SETUP = dict(task=task, policy=SmolLM2(system=SYSTEM), engine=HF(device="cpu"),
             warmstart=SFT(steps=50, batch_size=8, lr=5e-5, schedule="cosine"),
             evaluation=Evaluation(size=256, max_tokens=MAX_TOKENS, initial=False))
"""Task, policy, engine, warm start and evaluation (bench/real_long.py shares them). The
evaluation before the warm start is skipped: the base model scores 0% (above) and
rambles to ``max_tokens`` on every prompt, minutes of generation for a known figure."""

LR = 1e-5
"""The learning rate (see the module's docstring)."""

BATCH = 16
"""Prompts a step, each sampled 4 times (see the module's docstring: 8 was too noisy)."""

pipeline = Pipeline(
    name="smol-long",
    seed=0,
    steps=16,
    **SETUP,
    stages=[
        UniformSampler(batch=BATCH),
        GroupSample(n=4, temperature=1.0, max_tokens=MAX_TOKENS),
        Verify(scorer=ListOrder()),
        DynamicSampling(),
        GRPO(lr=LR, advantage="drgrpo", micro_batch=8),
    ],
)
