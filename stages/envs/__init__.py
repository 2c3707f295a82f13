"""Environments for multi-turn episodes (``stages.generate.episodes``), registered by
name (gfcr.core.environment.register_env): ``feedback``, ``guess``, ``python_tool``."""

from stages.envs.feedback import Feedback
from stages.envs.guess import GuessNumber
from stages.envs.python_tool import PythonArithmetic
from stages.envs.tools import PythonTool, parse_call

__all__ = ["Feedback", "GuessNumber", "PythonArithmetic", "PythonTool", "parse_call"]
