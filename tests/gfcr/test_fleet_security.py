"""The fleet's doors closed (issue 30; shared/notes/drills-4.md F1-F8, C1), one test per
attack class, against the suite's two real vLLM CPU servers (tests/conftest.py
``fleet_servers``, started with a fleet key and the session's temporary root as their
weights root). Every refused attack leaves the server serving the weights it held: the
same greedy tokens for a fixed prompt, the same label."""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from gfcr.cli import app
from gfcr.weights.versions import WeightStore
from stages.engines._fleet_client import Server, ServerError
from tests.resources import fleet as servers
from tests.resources.vllm import VLLM_POLICY

runner = CliRunner()
PROMPT = [5, 6, 7, 8, 9]
ROUTES = [("POST", "/gfcr/load"), ("GET", "/gfcr/weights"),
          ("POST", "/inference/v1/generate"), ("POST", "/inference/v1/abort_requests"),
          ("POST", "/collective_rpc"), ("POST", "/update_weight_version"),
          ("GET", "/weight_info"), ("POST", "/pause"), ("POST", "/reset_prefix_cache"),
          ("GET", "/server_info"), ("GET", "/v1/models"), ("POST", "/v1/completions"),
          ("GET", "/metrics"), ("POST", "/sleep"), ("POST", "/scale_elastic_ep")]
"""What a fleet uses and what the drills reached; none answers without the key."""


@pytest.fixture(scope="module")
def server(fleet_servers: list[servers.Started]) -> servers.Started:
    return servers.revive(fleet_servers)[0]


def _post(s: servers.Started, route: str, body: Any, key: bool = True) -> httpx.Response:
    headers = {"Authorization": "Bearer " + s.key().decode()} if key else {}
    return httpx.post(s.url + route, json=body, headers=headers, timeout=120)


def _state(s: servers.Started) -> tuple[str, list[int]]:
    """The server's label and its greedy tokens for PROMPT (what it serves)."""
    body = {"request_id": "probe", "token_ids": PROMPT,
            "sampling_params": {"temperature": 0.0, "max_tokens": 6, "detokenize": False}}
    tokens = _post(s, "/inference/v1/generate", body).json()["choices"][0]["token_ids"]
    label = httpx.get(s.url + "/gfcr/weights", timeout=30,
                      headers={"Authorization": "Bearer " + s.key().decode()}).json()["label"]
    return label, tokens


class _Handle:
    def __init__(self, seed: int) -> None:
        self.policy = VLLM_POLICY.build(seed=seed)

    def save(self, path: Path, dtype: str | None = None) -> None:
        self.policy.save_weights(path, dtype)


def _publish(where: Path, seed: int, version: int = 1) -> Path:
    return WeightStore(where, VLLM_POLICY.build(seed=0).io).publish(
        _Handle(seed), version, "t").path


def _forge(folder: Path, files: dict[str, bytes], names: list[str] | None = None) -> Path:
    """A version folder holding ``files``, its manifest listing ``names`` (default the
    files) with their real hashes."""
    folder.mkdir(parents=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)
    listed = list(files) if names is None else names
    (folder / "manifest.json").write_text(json.dumps({
        "version": int(folder.name[1:]), "id": "f0", "files": listed,
        "sha256": {n: hashlib.sha256(files.get(n, b"")).hexdigest() for n in listed}}))
    return folder


def _refused(s: servers.Started, folder: Path, match: str) -> None:
    answer = _post(s, "/gfcr/load", {"folder": str(folder)})
    assert answer.status_code == 400 and match in answer.json()["error"], answer.text


def test_unauthenticated_routes_are_refused(server: servers.Started) -> None:
    assert httpx.get(server.url + "/health", timeout=30).status_code == 200  # liveness only
    wrong = {"Authorization": "Bearer " + "0" * 64}
    for method, route in ROUTES:
        for headers in ({}, wrong):
            answer = httpx.request(method, server.url + route, json={}, headers=headers,
                                   timeout=30)
            assert answer.status_code == 401, (method, route, answer.text)


def test_forged_weight_load_is_refused(server: servers.Started) -> None:
    before = _state(server)
    outside = Path(tempfile.mkdtemp(prefix="gfcr-poison-"))  # not under the weights root
    try:
        poison = _publish(outside, seed=7)
        assert _post(server, "/gfcr/load", {"folder": str(poison)}, key=False).status_code == 401
        assert _post(server, "/collective_rpc", {"method": "gfcr_load", "args": [str(poison)]},
                     key=False).status_code == 401
        _refused(server, poison, "is not under the server's weights root")
    finally:
        shutil.rmtree(outside)
    assert _state(server) == before


def test_forged_version_label_is_refused(tmp_path: Path, server: servers.Started) -> None:
    label, _ = _state(server)
    for key, status in ((False, 401), (True, 403)):
        answer = _post(server, "/update_weight_version", {"new_version": "3:abc"}, key=key)
        assert answer.status_code == status
    assert _state(server)[0] == label
    folder = _publish(tmp_path / "w", seed=1, version=2)
    client = Server(server.url, timeout_s=120, key=server.key())
    with pytest.raises(ServerError, match="not '2:forged'"):
        client.load(str(folder), "2:forged")  # a label is the manifest's, never the caller's
    ident = json.loads((folder / "manifest.json").read_text())["id"]
    assert client.label() == f"2:{ident}"
    client.close()


def test_manifest_path_traversal_is_refused(tmp_path: Path, server: servers.Started) -> None:
    before = _state(server)
    other = _publish(tmp_path / "other", seed=7)
    run = tmp_path / "w"
    _refused(server, _forge(run / "v000001", {}, ["../../other/v000001/model.safetensors"]),
             "is not a plain name")
    _refused(server, _forge(run / "v000002", {}, [str(other / "model.safetensors")]),
             "is not a plain name")
    linked = _forge(run / "v000003", {}, ["model.safetensors"])
    (linked / "model.safetensors").symlink_to(other / "model.safetensors")
    _refused(server, linked, "not a regular file")
    _refused(server, tmp_path, "is not a published version")
    assert _state(server) == before


def test_a_bad_weights_file_leaves_the_server_serving(tmp_path: Path,
                                                      server: servers.Started) -> None:
    from safetensors.torch import load_file, save

    before = _state(server)
    good = _publish(tmp_path / "good", seed=7) / "model.safetensors"
    run = tmp_path / "w"
    _refused(server, _forge(run / "v000004", {"model.safetensors": b"root:x:0:0:root\n" * 9}),
             "not a safetensors file")
    changed = _forge(run / "v000005", {"model.safetensors": good.read_bytes()})
    data = bytearray((changed / "model.safetensors").read_bytes())
    data[-1] ^= 0xFF
    (changed / "model.safetensors").write_bytes(bytes(data))
    _refused(server, changed, "changed after publication")
    tensors = load_file(str(good))
    first = sorted(tensors)[0]
    tensors[first] = tensors[first][:-1].clone()
    _refused(server, _forge(run / "v000006", {"model.safetensors": save(tensors)}),
             f"tensor {first!r} has shape")
    assert server.proc.poll() is None and _state(server) == before


def test_other_worker_methods_are_refused(tmp_path: Path, server: servers.Started) -> None:
    before = _state(server)
    for method, kwargs in (("save_sharded_state", {"path": str(tmp_path)}),
                           ("reload_weights", {"weights_path": str(tmp_path)})):
        answer = _post(server, "/collective_rpc", {"method": method, "kwargs": kwargs})
        assert answer.status_code == 403 and "not a route" in answer.json()["error"]
    for route in ("/pause", "/sleep", "/reset_prefix_cache", "/weight_checker"):
        assert _post(server, route, {}).status_code == 403
    assert list(tmp_path.iterdir()) == []  # nothing written where the caller said
    assert _state(server) == before


def test_no_key_refuses_non_loopback(tmp_path: Path) -> None:
    argv = ["engine", "serve", "--model", str(tmp_path), "--host", "0.0.0.0"]
    result = runner.invoke(app, argv, env={"GFCR_FLEET_KEY_FILE": ""})
    assert result.exit_code == 2 and "needs the fleet's key" in result.output
    shared = tmp_path / "fleet.key"
    shared.write_text("k" * 64)
    shared.chmod(0o644)
    result = runner.invoke(app, argv + ["--key-file", str(shared)])
    assert result.exit_code == 2 and "may be read by others" in result.output


@pytest.mark.parametrize("url", ["file:///etc/passwd", "http://[::1", "http://a:1/v1",
                                 "http://a:notaport"])
def test_bad_fleet_urls_are_refused_before_any_work(tmp_path: Path, url: str) -> None:
    result = runner.invoke(app, ["run", "--fleet", url, "--root", str(tmp_path / "r")])
    assert result.exit_code == 2 and "fleet URL" in result.output
    assert not (tmp_path / "r").exists()  # nothing was started
