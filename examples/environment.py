"""A multi-turn environment in a few lines, and a pipeline that trains on it.

    gfcr run examples/environment.py
"""

from gfcr import Evaluation, Message, Pipeline, Step, register_env
from stages import GRPO, HF, Episodes, ReasoningGym, TinyLlama, UniformSampler


@register_env("higher_lower")
class HigherLower:
    """Answer the task's question; hear "higher" or "lower" until right (reward 1)."""

    def reset(self, task):
        self.answer = float(task["answer"])
        return [Message("user", task["prompt"])]

    def step(self, reply):
        try:
            guess = float(reply.strip())
        except ValueError:
            return Step([Message("user", " a number, please:")], reward=0.0)
        if guess == self.answer:
            return Step(reward=1.0, done=True)
        return Step([Message("user", " higher:" if guess < self.answer else " lower:")])


pipeline = Pipeline(
    name="higher-lower", steps=2,
    task=ReasoningGym(train_size=64, heldout_size=8),
    policy=TinyLlama(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64),
    engine=HF(device="cpu"),
    stages=[UniformSampler(batch=2),
            Episodes(env="higher_lower", n=4, max_turns=3, max_tokens=4),
            GRPO()],
    evaluation=Evaluation(size=4, max_tokens=4),
)
