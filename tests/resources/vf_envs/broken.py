"""A verifiers environment whose rubric misbehaves: on task 1 its reward raises, on task 2
it returns NaN, elsewhere it is 1.0."""

from __future__ import annotations

import verifiers.v1 as vf


class BadTask(vf.Task[vf.TaskData]):
    @vf.reward(weight=1.0)
    async def shaky(self, trace: vf.Trace) -> float:
        if self.data.idx == 1:
            raise RuntimeError("the rubric broke on task 1")
        return float("nan") if self.data.idx == 2 else 1.0


class BadTaskset(vf.Taskset[BadTask, vf.TasksetConfig]):
    def load(self) -> list[BadTask]:
        return [BadTask(vf.TaskData(prompt=f"task {i}"), self.config.task) for i in range(4)]


__all__ = ["BadTaskset"]
