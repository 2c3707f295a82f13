"""A verifiers environment with a tool: multiply two digits with the ``multiply`` tool of
an MCP toolset (verifiers serves it in a subprocess); reward 1.0 when the final reply
holds the product."""

from __future__ import annotations

import verifiers.v1 as vf


class MulData(vf.TaskData):
    answer: str = ""


class MulToolset(vf.Toolset[vf.ToolsetConfig]):
    TOOL_PREFIX = "calc"

    @vf.tool
    def multiply(self, a: int, b: int) -> str:
        """Multiply two integers."""
        return str(a * b)


class MulTaskConfig(vf.TaskConfig):
    tools: vf.ToolsetConfig = vf.ToolsetConfig()


class MulTask(vf.Task[MulData, vf.State, MulTaskConfig]):
    @classmethod
    def toolsets(cls, config: MulTaskConfig) -> list[vf.Toolset]:
        return [MulToolset(config.tools)]

    @vf.reward(weight=1.0)
    async def product(self, trace: vf.Trace) -> float:
        said = [str(n.message.content or "") for n in trace.nodes
                if n.message.role == "assistant"]
        return float(bool(said) and self.data.answer in said[-1])


class MulConfig(vf.TasksetConfig):
    num_tasks: int = 6
    task: MulTaskConfig = MulTaskConfig()


class MulTaskset(vf.Taskset[MulTask, MulConfig]):
    def load(self) -> list[MulTask]:
        return [MulTask(MulData(prompt=f"{i + 2}*{i + 3}=", answer=str((i + 2) * (i + 3))),
                        self.config.task) for i in range(self.config.num_tasks)]


__all__ = ["MulTaskset"]


if __name__ == "__main__":
    MulToolset.run()
