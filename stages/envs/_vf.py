"""Loading a verifiers (v1) environment and running its episodes from gfcr's threads.

verifiers 0.4.0 ships only its v1 stack (``verifiers.v1``): an environment is a taskset
package (a ``vf.Taskset`` subclass exported in ``__all__``, maybe with its own ``vf.Env``)
loaded by ``vf.load_environment(EnvConfig)``. A module may instead define
``load_environment(**args)`` returning a ``vf.Env``. The pre-v1 classes (SingleTurnEnv,
MultiTurnEnv, ToolEnv) are not in 0.4.0, so environments written for them do not load.

Every seat of the environment is given gfcr's in-process harness
(:mod:`stages.envs._vf_harness`) and the local subprocess runtime (verifiers' default is a
remote sandbox), and ``max_turns``. Episodes run on one event loop thread per step
(:class:`Runner`), inside ``env.serving()``; gfcr's agent threads wait on them.
"""

from __future__ import annotations

import asyncio
import importlib
import math
import os
import sys
import threading
from typing import Any

INSTALL = "pip install -e '.[envs]' (verifiers==0.4.0)"


def verifiers() -> Any:
    """``verifiers.v1``, or an error that says how to install it."""
    try:
        import verifiers.v1 as vf
    except ImportError as err:
        raise ImportError(f"VerifiersEnv needs the verifiers package: {INSTALL} "
                          f"({err})") from None
    from stages.envs import _vf_harness
    _vf_harness.register()
    return vf


def load(module: str, args: dict[str, Any], max_turns: int) -> Any:
    """The environment ``module`` names, its seats on gfcr's harness; errors name it."""
    vf = verifiers()
    where = f"verifiers environment {module!r}"
    try:
        found = importlib.import_module(module)
    except ModuleNotFoundError as err:
        raise ValueError(f"{where}: no such module ({err}); install the environment's "
                         "package or put its module on the path") from None
    try:
        if callable(getattr(found, "load_environment", None)):
            env = found.load_environment(**args)
            if not isinstance(env, vf.Env):
                raise TypeError(f"load_environment returned {type(env).__name__}, not a "
                                "verifiers.v1 Env (pre-v1 environments do not run on "
                                "verifiers 0.4.0)")
            raw = env.config.model_dump()
        else:
            raw = {"taskset": {"id": _importable(found), **args}}
        return _seated(vf, raw, max_turns)
    except Exception as err:  # noqa: BLE001 - the environment's error, named
        raise ValueError(f"{where}: loading failed: {type(err).__name__}: {err}") from err


def _importable(found: Any) -> str:
    """An id verifiers can import: a dotted module gets a top-level alias (verifiers
    imports ``name`` after trying ``verifiers.v1.tasksets.name``, which a dot breaks)."""
    name: str = found.__name__
    if "." not in name:
        return name
    alias = "gfcr_vf_" + name.replace(".", "_").lower()
    sys.modules.setdefault(alias, found)
    return alias


def _seated(vf: Any, raw: dict[str, Any], max_turns: int) -> Any:
    from stages.envs._vf_harness import HARNESS_ID
    from verifiers.v1.configs.agent import agent_config_fields
    config = vf.resolve_env_config(raw)
    dumped = config.model_dump()
    for role in agent_config_fields(config):
        dumped[role] = {**dumped[role], "harness": {"id": HARNESS_ID},
                        "runtime": {"type": "subprocess"}, "max_turns": max_turns}
    dumped["interception"] = {"type": "server"}
    return vf.load_environment(vf.resolve_env_config(dumped))


def tasks(env: Any) -> list[Any]:
    """The environment's tasks, in its order (``idx`` set)."""
    return list(env.taskset)


def task_for(env: Any, found: dict[int, Any], row: dict[str, Any]) -> Any:
    """The environment's task of a task row: its own (``meta.vf_idx``), or, for a row of
    another task, the environment's task type on the row's prompt (and answer)."""
    meta = row.get("meta")
    if isinstance(meta, dict) and isinstance(meta.get("vf_idx"), int):
        if meta["vf_idx"] in found:
            return found[meta["vf_idx"]]
    cls = type(env.taskset).task_type()
    data_cls = cls.data_type()
    fields: dict[str, Any] = {"prompt": row["prompt"]}
    if "answer" in data_cls.model_fields and row.get("answer") is not None:
        fields["answer"] = row["answer"]
    return cls(data_cls(**fields), env.taskset.config.task)


def outcome(episode: Any) -> tuple[float, dict[str, float]]:
    """(the rubric's weighted sum, each reward function's value) of a finished episode;
    an episode that failed, or a reward that is not a finite number, raises with why."""
    errors = list(episode.errors) + [e for t in episode.traces for e in t.errors]
    if errors or not episode.ok:
        first = errors[0] if errors else None
        raise RuntimeError("the environment's episode failed: " + (
            f"{first.type}: {first.message}" if first else "no trace completed"))
    components: dict[str, float] = {}
    total = 0.0
    for trace in episode.traces:
        for name, reward in trace.rewards.items():
            if reward is None or not math.isfinite(reward.score):
                raise ValueError(f"reward function {name!r} returned "
                                 f"{None if reward is None else reward.score!r}, "
                                 "not a finite number")
            components[name] = components.get(name, 0.0) + reward.score
        total += trace.reward
    return total, components


def score_reply(task: Any, reply: str) -> float:
    """The rubric's weighted sum on a one-turn conversation: the task's prompt and
    ``reply`` (what a held-out evaluation of single completions can score); raises like
    :func:`outcome` on a reward that raises or is not finite."""
    vf = verifiers()
    from verifiers.v1.graph import MessageNode
    from verifiers.v1.trace import AgentInfo, TraceTask
    nodes = [MessageNode(message=vf.UserMessage(content=task.data.prompt_text)),
             MessageNode(parent=0, message=vf.AssistantMessage(content=reply), sampled=True)]
    trace = vf.Trace(task=TraceTask(type=type(task).__name__, data=task.data),
                     agent=AgentInfo(config=vf.AgentConfig()), nodes=nodes)
    asyncio.run(task.score(trace))
    for name, reward in trace.rewards.items():
        if reward is None or not math.isfinite(reward.score):
            raise ValueError(f"reward function {name!r} returned "
                             f"{None if reward is None else reward.score!r}")
    return float(trace.reward)


def children_path(current: str | None) -> str:
    """``PYTHONPATH`` for the processes verifiers starts during a step: this process's
    own import path (what ``sys.path`` holds beyond the interpreter's installation: the
    project, a test's or a user's module folder) before ``current``. verifiers' subprocess
    runtime starts an environment's MCP tool server as ``python -m MODULE`` in a cache
    folder, and without it a module this process imported from its path is not found
    there: the server never comes up and the episode runs out its time."""
    base = tuple(os.path.realpath(p) for p in {sys.prefix, sys.base_prefix})
    own = [p for p in sys.path
           if p and os.path.isdir(p) and not os.path.realpath(p).startswith(base)]
    return os.pathsep.join(dict.fromkeys(own + ([current] if current else [])))


class Runner:
    """An event loop on its own thread holding ``env.serving()`` for a step; gfcr's agent
    threads run episodes on it and wait."""

    def __init__(self, env: Any) -> None:
        self.env = env
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True,
                                       name="gfcr-verifiers")
        self._serving: Any = None
        self._path: str | None = None

    def __enter__(self) -> "Runner":
        self._path = os.environ.get("PYTHONPATH")
        os.environ["PYTHONPATH"] = children_path(self._path)
        self.thread.start()
        self._serving = self.env.serving()
        self.call(self._serving.__aenter__(), None)
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            self.call(self._serving.__aexit__(None, None, None), 60.0)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=10.0)
            if self._path is None:
                os.environ.pop("PYTHONPATH", None)
            else:
                os.environ["PYTHONPATH"] = self._path

    def call(self, coro: Any, timeout: float | None) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def episode(self, task: Any, model: str, base_url: str, timeout: float) -> Any:
        vf = verifiers()
        ctx = vf.ModelContext(model=model, client=vf.EvalClientConfig(
            base_url=base_url, api_key_var="GFCR_VERIFIERS_KEY"))
        return self.call(self.env.run_episode(task, ctx), timeout)
