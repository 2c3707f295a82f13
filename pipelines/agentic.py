"""Multi-turn episodes: the policy answers, hears whether it was right, and may try again.

The default pipeline's task, tiny policy and cached warm start, with the generate stage
replaced by :class:`stages.Episodes` against the ``feedback`` environment
(:mod:`stages.envs.feedback`): up to two answers per question; a wrong first answer
hears "wrong, try again. hint: <the answer>." followed by the question again. The
episode's reward is 1 if either answer is right, so what the policy can learn beyond
answering right at once is to read the feedback: the warm start, trained on single-turn
answers, mostly repeats its first answer. The trajectories (prompt, answer, feedback,
second answer) are stored as turns; the feedback's tokens are out of the loss. The
held-out evaluation is the task's (single-turn greedy accuracy); bench/agentic.py
measures held-out episode success.

Any environment runs the same way: ``Episodes(env="guess")``, ``env="python_tool"``
(the sandboxed Python tool), or ``env="mymodule:MyEnv"`` (README, "Environments").
"""

from gfcr import Pipeline
from stages import GRPO, Episodes, UniformSampler
from pipelines.default import LR, SETUP

FEEDBACK = {"max_tries": 2, "hint": "answer", "repeat": True}
"""The feedback environment's options: two tries, the answer as the hint, the question
repeated so the second try ends like a first one."""

pipeline = Pipeline(
    name="agentic",
    seed=0,
    steps=40,
    **SETUP,
    stages=[
        # --- Replay: which questions this step
        UniformSampler(batch=16),
        # --- Generate: 8 episodes per question, every turn-wave one batched engine call
        Episodes(env="feedback", env_options=FEEDBACK, n=8, temperature=1.0, max_turns=2,
                 max_tokens=8, max_episode_tokens=160),
        # --- Train: the environment's reward, group-normalised; feedback tokens masked
        GRPO(lr=LR),
    ],
)
