"""Shared fixtures: a tiny pipeline, one Prefect test server for the whole session, the
engine pools' key, and two vLLM servers for the fleet tests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")


SUMS = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2}
"""Two 1-2 digit terms: short answers for a tiny policy."""


def tiny_pipeline(**overrides):
    """A pipeline small enough to run a step in about a second on one CPU core."""
    from gfcr import Evaluation, Pipeline
    from stages import (GRPO, HF, DynamicSampling, GroupSample, ReasoningGym, TinyLlama,
                        UniformSampler, Verify)

    fields = dict(
        name="tiny", seed=0, steps=2,
        task=ReasoningGym(train_size=64, heldout_size=16, config=SUMS),
        # the character tokenizer: the suite's statistical expectations (lengths of random
        # completions stopped by a digit) were set with its 101-id vocabulary
        policy=TinyLlama(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64,
                         tokenizer="char"),
        engine=HF(device="cpu"),
        stages=[UniformSampler(batch=4), GroupSample(n=4, max_tokens=6), Verify(),
                DynamicSampling(), GRPO(lr=1e-3)],
        evaluation=Evaluation(size=8, max_tokens=6),
    )
    fields.update(overrides)
    return Pipeline(**fields)


@pytest.fixture
def pipeline():
    return tiny_pipeline()


@pytest.fixture(scope="session")
def prefect_server():
    """One Prefect API server (temporary SQLite database) shared by every test."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=180):
        yield


@pytest.fixture(scope="session")
def pool_key(tmp_path_factory: pytest.TempPathFactory):
    """A pool key (gfcr.transport.remote.keys) that this process's runs and the engine workers it
    starts (which inherit the environment) sign and check calls with."""
    from gfcr.transport.remote.keys import KEY_ENV, new_key

    path = new_key(tmp_path_factory.mktemp("pool-key") / "pool.key")
    before = os.environ.get(KEY_ENV)
    os.environ[KEY_ENV] = str(path)
    yield path
    if before is None:
        os.environ.pop(KEY_ENV, None)
    else:
        os.environ[KEY_ENV] = before


@pytest.fixture(scope="session")
def fleet_servers(tmp_path_factory: pytest.TempPathFactory):
    """Two real vLLM CPU servers (``gfcr engine serve``) shared by the fleet test modules
    (tests.resources.fleet); skips without vLLM (fails under CI)."""
    from tests.resources import fleet
    from tests.resources.vllm import vllm_engine_spec

    vllm_engine_spec()
    yield from fleet.pool(tmp_path_factory.mktemp("fleet"), tmp_path_factory.getbasetemp())


SLOW_FIXTURES = frozenset({"fleet_servers", "prefect_server"})
"""Fixtures that start servers: a test using one is slow whatever it takes itself."""


def _slow_tests() -> frozenset[str]:
    """Test functions that tests/slow.txt names (written by tools/slow_tests.py)."""
    listed = Path(__file__).with_name("slow.txt")
    if not listed.exists():
        return frozenset()
    return frozenset(line.strip() for line in listed.read_text().splitlines()
                     if line.strip() and not line.startswith("#"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the slow tests ``slow``, so ``pytest -m "not slow"`` is the fast subset."""
    slow = _slow_tests()
    for item in items:
        if item.nodeid.split("[")[0] in slow or SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
