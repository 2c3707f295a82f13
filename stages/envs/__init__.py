"""Environments for multi-turn episodes (``stages.generate.episodes``), registered by
name (gfcr.core.environment.register_env): ``feedback``, ``guess``, ``python_tool``, and
the adapters for environments from elsewhere: ``gym`` (Gymnasium-style text
environments), ``textarena`` (TextArena games), ``remote`` (OpenEnv-style HTTP servers),
whose stage builders (``GymEnv``, ``TextArenaEnv``, ``RemoteEnv``) are generate stages
(stages.generate.env_stages)."""

from stages.envs import arena, catalogue, gym, remote  # noqa: F401 - registers them
from stages.envs.feedback import Feedback
from stages.envs.guess import GuessNumber
from stages.envs.python_tool import PythonArithmetic
from stages.envs.tools import PythonTool, parse_call

__all__ = ["Feedback", "GuessNumber", "PythonArithmetic", "PythonTool", "parse_call"]
