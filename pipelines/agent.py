"""An agent written against the ``openai`` client, trained with GRPO: the agent of
``examples/agent_calculator.py`` (a calculator tool it runs itself) answers the default
pipeline's sums through gfcr's OpenAI-compatible endpoint over the policy, and what it
returns is the reward, so there is no Verify stage.

The tiny policy reads the plain chat format (gfcr.chat.formats): the first turn is the question
text as single-turn pipelines show it, after the tools the agent declares (the warm start
is the default's, on a policy with a longer context); the policy's tool calls, if any, are
``<tool_call>`` blocks (stages.endpoint._toolcalls). Run it from the repository root,
where the agent's module is found (``gfcr run agent``). The held-out evaluation is the
default's (greedy single-turn answers, the task's scorer), not the agent's episodes.
"""

from gfcr import Pipeline
from pipelines.default import LR, SETUP
from stages import GRPO, AgentEnv, TinyLlama, UniformSampler

CONTEXT = 1024
"""The policy's context (the default's 256 holds a single-turn sum, not the tool
declaration and a few turns); a longer context changes no weight shape."""

pipeline = Pipeline(
    name="agent",
    seed=0,
    steps=40,
    **{**SETUP, "policy": TinyLlama(max_position=CONTEXT)},
    stages=[
        # --- Replay: which tasks this step
        UniformSampler(batch=16),
        # --- Generate: 8 episodes of the user's agent per task; its return is the reward
        AgentEnv(agent="examples.agent_calculator:solve", n=8, max_tokens=8, temperature=1.0),
        # --- Train: group-normalised advantages over each task's episodes
        GRPO(lr=LR),
    ],
)
