"""The fleet's configuration, its server command and its failure message: no server
needed (the servers' own tests are in tests/gfcr/test_fleet.py)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gfcr.core.engine import GenRequest, SamplingParams
from gfcr.transport.fleet import Fleet, for_run
from gfcr.transport.fleet_serve import EXTENSION, command, deployment
from tests.conftest import tiny_pipeline
from tests.resources.fleet import free_port


def test_a_fleet_names_each_server_once_by_its_url() -> None:
    assert Fleet(urls=("http://a:8000/",)).urls == ("http://a:8000",)
    with pytest.raises(ValidationError, match="'a:8000' is not a server's base URL"):
        Fleet(urls=("a:8000",))
    with pytest.raises(ValidationError, match="'http://a:1' is listed twice"):
        Fleet(urls=("http://a:1", "http://a:1/"))
    with pytest.raises(ValidationError, match="at least 1 item"):
        Fleet(urls=())
    with pytest.raises(ValidationError, match="Extra inputs"):
        Fleet(urls=("http://a:1",), pool="x")


def test_an_engine_that_has_no_servers_is_refused_naming_it(tmp_path) -> None:
    p = tiny_pipeline()  # the HF engine
    with pytest.raises(ValueError, match="engine 'hf' cannot run as a fleet"):
        for_run(Fleet(urls=("http://a:1",)), p, "r", tmp_path, p.policy.build(seed=0), print)


def test_the_server_command_is_vllms_own_server_with_the_fleet_options() -> None:
    argv = command("/m", port=9001, dtype="bfloat16", extra=["--kv-cache-memory-bytes", "5"])
    assert argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert argv[argv.index("--worker-extension-cls") + 1] == EXTENSION
    assert argv[argv.index("--logprobs-mode") + 1] == "processed_logprobs"
    assert {"--enable-scale-out", "--skip-tokenizer-init"} <= set(argv)
    assert argv[argv.index("--dtype") + 1] == "bfloat16" and argv[-2:] == [
        "--kv-cache-memory-bytes", "5"]
    module, _, name = EXTENSION.rpartition(".")
    assert hasattr(__import__(module, fromlist=[name]), name)


def test_a_deployment_runs_one_server_per_flow_run_on_a_pool() -> None:
    d = deployment("gpu-a", pool="gpus", model="/models/m", port=8100,
                   job_variables={"env": {"CUDA_VISIBLE_DEVICES": "0"}})
    assert d.work_pool_name == "gpus" and d.parameters["port"] == 8100
    assert d.entrypoint == "gfcr.transport.fleet_serve.serve_flow"
    assert d.job_variables["env"]["CUDA_VISIBLE_DEVICES"] == "0"


def test_a_fleet_that_cannot_serve_fails_naming_every_server() -> None:
    from stages.engines.fleet import FleetDown, FleetEngine
    from tests.resources.vllm import VLLM_POLICY

    urls = [f"http://127.0.0.1:{free_port()}" for _ in range(2)]  # nothing listens
    engine = FleetEngine(VLLM_POLICY.build(seed=0), urls, timeout_s=5, attempts=2)
    with pytest.raises(FleetDown) as err:
        engine.generate([GenRequest(key=0, prompt_ids=[5, 6])], SamplingParams(max_tokens=2))
    engine.close()
    message = str(err.value)
    assert "the fleet cannot serve" in message
    assert all(f"{u}: vLLM server {u}: /gfcr/weights failed" in message for u in urls)


def test_a_group_shares_a_server_and_goes_back_to_it_while_the_load_stays_fair() -> None:
    """Placement alone (no request is sent): a task's episodes name their group, and the
    next turn-wave finds each group on the server that holds its conversation so far."""
    from stages.engines._seqs import new_seq
    from stages.engines.fleet import FleetEngine
    from tests.resources.vllm import VLLM_POLICY

    a, b = "http://127.0.0.1:1", "http://127.0.0.1:2"
    engine = FleetEngine(VLLM_POLICY.build(seed=0), [a, b])

    def place(*groups: tuple[str, int]) -> dict[str, set[str]]:
        names = [g for g, n in groups for _ in range(n)]  # distinct prompts, by group
        requests = [GenRequest(key=k, prompt_ids=[k + 1], group=g) for k, g in enumerate(names)]
        owner = engine._assign([new_seq(r, SamplingParams()) for r in requests], None)
        out: dict[str, set[str]] = {}
        for r in requests:
            out.setdefault(str(r.group), set()).add(owner[r.key].url)
        return out

    assert place(("g1", 4), ("g2", 4)) == {"g1": {a}, "g2": {b}}  # whole groups, split
    assert place(("g2", 3), ("g1", 3)) == {"g1": {a}, "g2": {b}}  # back to their servers
    engine.down[b] = "test: out of the fleet"
    assert place(("g1", 2), ("g2", 2)) == {"g1": {a}, "g2": {a}}
    engine.down.clear()  # back: the fair share moves one group to it again
    assert place(("g1", 2), ("g2", 2)) == {"g1": {a}, "g2": {b}}
    engine.close()
