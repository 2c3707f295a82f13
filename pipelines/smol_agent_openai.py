"""SmolLM2 learns to use a Python tool through an ``openai``-client agent (AgentEnv).

The smol-agent pipeline's task, policy, warm start and evaluation (pipelines/smol_agent.py),
with the generate stage replaced by :class:`stages.AgentEnv` running
``examples/agent_python.py``: an agent that declares a ``python`` function tool to gfcr's
OpenAI-compatible endpoint over the policy, runs the calls the endpoint parses out of
SmolLM2's turns (``<tool_call>`` blocks, stages/endpoint/_toolcalls.py) in the sandbox,
and returns the reward with its call and error counts. Its conversation (the
``python_tool`` environment's system message, the question; the model's call; the tool's
output) renders through SmolLM2's ChatML template to the same ids as an Episodes run, so
the same demonstration warm start teaches it the call format. Run it from the repository
root, where ``examples`` is found (``gfcr run smol-agent-openai``).
"""

from gfcr import Pipeline
from pipelines.smol_agent import EPISODES, LR, SETUP
from stages import GRPO, AgentEnv, UniformSampler

pipeline = Pipeline(
    name="smol-agent-openai",
    seed=0,
    steps=8,
    **SETUP,
    stages=[
        UniformSampler(batch=4),
        AgentEnv(agent="examples.agent_python:solve", n=int(EPISODES["n"]),
                 temperature=float(EPISODES["temperature"]),
                 max_tokens=int(EPISODES["max_tokens"])),
        GRPO(lr=LR, micro_batch=8),
    ],
)
