"""A single-turn verifiers environment: say a digit; rewards for containing it and for
brevity (weights 1.0 and 0.5)."""

from __future__ import annotations

import verifiers.v1 as vf


class DigitData(vf.TaskData):
    answer: str = ""


class DigitTask(vf.Task[DigitData]):
    @vf.reward(weight=1.0)
    async def contains(self, trace: vf.Trace) -> float:
        return float(self.data.answer in reply(trace))

    @vf.reward(weight=0.5)
    async def brief(self, trace: vf.Trace) -> float:
        return 1.0 / (1.0 + len(reply(trace)))


def reply(trace: vf.Trace) -> str:
    """The last assistant message's text."""
    for node in reversed(trace.nodes):
        if node.message.role == "assistant":
            return str(node.message.content or "")
    return ""


class DigitConfig(vf.TasksetConfig):
    num_tasks: int = 10


class DigitTaskset(vf.Taskset[DigitTask, DigitConfig]):
    def load(self) -> list[DigitTask]:
        return [DigitTask(DigitData(prompt=f"Say the digit {i % 10} ({i}).", answer=str(i % 10)),
                          self.config.task) for i in range(self.config.num_tasks)]


__all__ = ["DigitTaskset"]
