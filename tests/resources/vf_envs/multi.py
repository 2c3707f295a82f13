"""A multi-turn verifiers environment: guess a digit in up to three turns, the environment
answering "higher", "lower" or "correct"; its own ``vf.Env`` drives the exchange through
an ``Interaction``. Rewards: solved (1.0) and the turns taken (metric-like, weight 0)."""

from __future__ import annotations

import verifiers.v1 as vf

ROUNDS = 3


class GuessData(vf.TaskData):
    secret: int = 0


class GuessTask(vf.Task[GuessData]):
    @vf.reward(weight=1.0)
    async def solved(self, trace: vf.Trace) -> float:
        return float(any(feedback(self.data.secret, m) == "correct" for m in replies(trace)))

    @vf.reward(weight=0.0)
    async def guesses(self, trace: vf.Trace) -> float:
        return float(len(replies(trace)))


def replies(trace: vf.Trace) -> list[str]:
    return [str(n.message.content or "") for n in trace.nodes if n.message.role == "assistant"]


def feedback(secret: int, text: str) -> str:
    digits = [int(c) for c in text if c.isdigit()]
    if not digits:
        return "say a digit"
    return "correct" if digits[0] == secret else "higher" if digits[0] < secret else "lower"


class GuessConfig(vf.TasksetConfig):
    num_tasks: int = 10


class GuessTaskset(vf.Taskset[GuessTask, GuessConfig]):
    def load(self) -> list[GuessTask]:
        return [GuessTask(GuessData(prompt=f"Guess my digit (game {i}).", secret=(3 * i) % 10),
                          self.config.task) for i in range(self.config.num_tasks)]


class GuessEnvConfig(vf.EnvConfig):
    agent: vf.AgentConfig = vf.AgentConfig()


class GuessEnv(vf.Env[GuessEnvConfig]):
    async def run(self, task: vf.Task, agents: vf.Agents) -> None:
        async with agents.agent.interaction(task) as talk:
            segment = await talk.turn()
            for _ in range(ROUNDS - 1):
                if segment.terminated:
                    return
                said = feedback(task.data.secret, segment.last_reply)
                if said == "correct":
                    return
                segment = await talk.turn(said)


__all__ = ["GuessTaskset", "GuessEnv"]
