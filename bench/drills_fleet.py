"""Fleet drills F1-F8 (shared/notes/drills-4.md, issue 30) rerun against a live
``gfcr engine serve`` server: how many got in, how many killed the server.

Each drill is what the tester did on Nov 28, aimed at one server (started here on the
test suite's tiny vLLM policy unless ``--url`` names one, with ``--key-file`` and
``--weights-root`` as it was started):

- F1 forged weight load: a folder outside the weights root (another model, a valid
  manifest with hashes) loaded without the key (``/gfcr/load`` and the old
  ``/collective_rpc gfcr_load``), then with the key;
- F2 forged version label: ``/update_weight_version`` without and with the key;
- F3 manifest path traversal: ``../`` and absolute names, a symlink out of the folder;
- F4 a file that is not safetensors (``/etc/passwd`` with its right hash), a file
  changed after publication, tensors of the wrong shape; then a generate;
- F5 pickle weights: ``pytorch_model.bin`` whose pickle writes a file; vLLM's own
  ``reload_weights`` on it through ``/collective_rpc``;
- F6 ``save_sharded_state`` through ``/collective_rpc`` (a file write where the caller says);
- F7 ``/pause`` (and ``/sleep``), without and with the key;
- F8 every other route without the key (``--api-key`` guarded only ``/v1``, ``/inference``).

"got in" is any answer 200 to an attack, a changed label, changed greedy tokens for a
fixed prompt, or a file the attack wrote; "killed" is a server that no longer answers
``/health`` or a generate after the drill. A last control row loads a real published
version with the key: it must get in (the run's own path still works).

    .venv/bin/python bench/drills_fleet.py            # starts a server, prints a table
    .venv/bin/python bench/drills_fleet.py --json
    .venv/bin/python bench/drills_fleet.py --url http://127.0.0.1:8000 \\
        --key-file fleet.key --weights-root .gfcr/weights
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pickle
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PROMPT = [5, 6, 7, 8, 9]


class Target:
    """The server under drill and what an attacker and the run can send it."""

    def __init__(self, url: str, key: str, root: Path, scratch: Path) -> None:
        self.url, self.key, self.root, self.scratch = url.rstrip("/"), key, root, scratch
        self.http = httpx.Client(base_url=self.url, timeout=120)

    def post(self, route: str, body: Any, keyed: bool) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.key}"} if keyed else {}
        return self.http.post(route, json=body, headers=headers)

    def alive(self) -> bool:
        try:
            return self.http.get("/health", timeout=10).status_code == 200 and \
                self.greedy() is not None
        except httpx.HTTPError:
            return False

    def greedy(self) -> list[int] | None:
        body = {"request_id": "drill", "token_ids": PROMPT, "sampling_params": {
            "temperature": 0.0, "max_tokens": 8, "detokenize": False}}
        r = self.post("/inference/v1/generate", body, keyed=True)
        return r.json()["choices"][0]["token_ids"] if r.status_code == 200 else None

    def label(self) -> str:
        return str(self.http.get("/gfcr/weights", headers={
            "Authorization": f"Bearer {self.key}"}).json().get("label"))


def _publish(where: Path, seed: int, version: int = 1) -> Path:
    """A real published version of the tiny policy with ``seed`` (another model)."""
    from gfcr.weights.versions import WeightStore
    from tests.resources.vllm import VLLM_POLICY

    policy = VLLM_POLICY.build(seed=seed)

    class Handle:
        def save(self, path: Path, dtype: str | None = None) -> None:
            policy.save_weights(path, dtype)

    return WeightStore(where, policy.io).publish(Handle(), version, "drill").path


def _forge(folder: Path, files: dict[str, bytes], names: list[str] | None = None) -> Path:
    """A version folder with ``files`` and a manifest naming ``names`` (default: the
    files), each with its real SHA-256."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)
    listed = names if names is not None else list(files)
    hashes = {n: hashlib.sha256(files.get(n, b"")).hexdigest() for n in listed}
    manifest = {"version": int(folder.name[1:]), "id": "deadbeef", "files": listed,
                "sha256": hashes}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


class Evil:
    """A pickle that writes a file when loaded (F5)."""

    def __init__(self, mark: Path) -> None:
        self.mark = mark

    def __reduce__(self) -> tuple[Callable[..., Any], tuple[str]]:
        return (os.system, (f"id > {self.mark}",))


Sends = list[Callable[[], httpx.Response]]


def drills(t: Target) -> list[dict[str, Any]]:
    """Every drill: name, what was sent, answers, got in, killed."""
    base = t.root / "drill-run"
    shutil.rmtree(base, ignore_errors=True)
    mark = t.scratch / "PWNED"
    out = [_drill(t, name, what, sends, mark) for name, what, sends in _cases(t, base, mark)]
    control = _publish(base, seed=3, version=9)
    out.append(_drill(t, "control", "the run's own published version, with the key",
                      [lambda: t.post("/gfcr/load", {"folder": str(control)}, True)], mark,
                      control=True))
    shutil.rmtree(base, ignore_errors=True)
    return out


def _cases(t: Target, base: Path, mark: Path) -> list[tuple[str, str, Sends]]:
    """The drills' requests (each sent when its drill runs)."""
    outside = _publish(t.scratch / "poison", seed=7)
    good = t.scratch / "good.safetensors"
    shutil.copyfile(outside / "model.safetensors", good)
    tensors = _shapes_off(good)
    return [
        ("F1", "forged load from outside the root", [
            lambda: t.post("/gfcr/load", {"folder": str(outside)}, False),
            lambda: t.post("/collective_rpc", {"method": "gfcr_load",
                                               "args": [str(outside)]}, False),
            lambda: t.post("/gfcr/load", {"folder": str(outside)}, True)]),
        ("F2", "forged version label", [
            lambda: t.post("/update_weight_version", {"new_version": "3:abc"}, False),
            lambda: t.post("/update_weight_version", {"new_version": "3:abc"}, True)]),
        ("F3", "manifest path traversal", [
            lambda: t.post("/gfcr/load", {"folder": str(_forge(
                base / "v000001", {}, ["../../poison/v000001/model.safetensors"]))}, True),
            lambda: t.post("/gfcr/load", {"folder": str(_forge(
                base / "v000002", {}, [str(outside / "model.safetensors")]))}, True),
            lambda: t.post("/gfcr/load", {"folder": str(_symlinked(
                base / "v000003", outside / "model.safetensors"))}, True)]),
        ("F4", "a bad file: not safetensors, changed, wrong shapes", [
            lambda: t.post("/gfcr/load", {"folder": str(_forge(
                base / "v000004", {"model.safetensors": Path("/etc/passwd").read_bytes()}))},
                True),
            lambda: t.post("/gfcr/load", {"folder": str(_changed(base / "v000005", good))},
                           True),
            lambda: t.post("/gfcr/load", {"folder": str(_forge(
                base / "v000006", {"model.safetensors": tensors}))}, True)]),
        ("F5", "pickle weights", [
            lambda: t.post("/gfcr/load", {"folder": str(_forge(
                base / "v000007", {"pytorch_model.bin": pickle.dumps(Evil(mark))}))}, True),
            lambda: t.post("/collective_rpc", {"method": "reload_weights", "kwargs": {
                "weights_path": str(base / "v000007")}}, True)]),
        ("F6", "save_sharded_state writes where the caller says", [
            lambda: t.post("/collective_rpc", {"method": "save_sharded_state", "kwargs": {
                "path": str(t.scratch)}}, False),
            lambda: t.post("/collective_rpc", {"method": "save_sharded_state", "kwargs": {
                "path": str(t.scratch)}}, True)]),
        ("F7", "pause / sleep", [
            lambda: t.post("/pause", {}, False), lambda: t.post("/pause", {}, True),
            lambda: t.post("/sleep", {}, True)]),
        ("F8", "routes without the key", [
            lambda route=route: t.http.get(route) for route in
            ("/gfcr/weights", "/weight_info", "/server_info", "/is_paused", "/v1/models",
             "/metrics", "/version", "/load")] + [
            lambda: t.post("/inference/v1/generate", {"token_ids": PROMPT}, False),
            lambda: t.post("/reset_prefix_cache", {}, False)]),
    ]


def _drill(t: Target, name: str, what: str, sends: Sends,
           mark: Path, control: bool = False) -> dict[str, Any]:
    before_label, before_tokens = t.label(), t.greedy()
    written = set(os.listdir(t.scratch))
    answers = []
    for send in sends:
        try:
            answers.append(send().status_code)
        except httpx.HTTPError as err:
            answers.append(type(err).__name__)
    killed = not t.alive()
    changed = not killed and (t.label() != before_label or t.greedy() != before_tokens)
    wrote = bool(set(os.listdir(t.scratch)) - written) or mark.exists()
    got_in = (200 in answers) or changed or wrote
    return {"drill": name, "what": what, "answers": answers, "got_in": got_in,
            "killed": killed, "expected": got_in if control else not got_in}


def _shapes_off(good: Path) -> bytes:
    """``good``'s tensors with the first one's shape changed (the wrong model)."""
    from safetensors.torch import load_file, save

    tensors = load_file(str(good))
    first = sorted(tensors)[0]
    tensors[first] = tensors[first].flatten()[:-1].clone()
    return save(tensors)


def _changed(folder: Path, good: Path) -> Path:
    _forge(folder, {"model.safetensors": good.read_bytes()})
    data = bytearray((folder / "model.safetensors").read_bytes())
    data[-1] ^= 0xFF  # one byte changed after the hash was written
    (folder / "model.safetensors").write_bytes(bytes(data))
    return folder


def _symlinked(folder: Path, target: Path) -> Path:
    _forge(folder, {}, ["model.safetensors"])
    (folder / "model.safetensors").symlink_to(target)
    return folder


def _serve(scratch: Path) -> tuple[Any, str, Path, Path]:
    from gfcr.transport.remote.keys import new_key
    from stages.engines._vllm_run import save_policy
    from tests.resources import fleet
    from tests.resources.vllm import VLLM_POLICY

    save_policy(VLLM_POLICY.build(seed=0), scratch / "model")
    key, root = new_key(scratch / "fleet.key"), scratch / "weights"
    root.mkdir()
    server = fleet.start(scratch / "model", scratch / "server.log", key, root)
    fleet.wait_healthy([server])
    return server, server.url, key, root


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url")
    parser.add_argument("--key-file")
    parser.add_argument("--weights-root")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="gfcr-drills-"))
    server = None
    try:
        if args.url:
            url, key_file, root = args.url, Path(args.key_file), Path(args.weights_root)
        else:
            server, url, key_file, root = _serve(scratch / "server")
        attack = scratch / "attacker"
        attack.mkdir()
        rows = drills(Target(url, key_file.read_text().strip(), root.resolve(), attack))
    finally:
        if server is not None:
            server.kill()
        shutil.rmtree(scratch, ignore_errors=True)
    attacks = [r for r in rows if r["drill"] != "control"]
    summary = {"got_in": sum(r["got_in"] for r in attacks),
               "killed": sum(r["killed"] for r in rows),
               "control_loaded": all(r["got_in"] for r in rows if r["drill"] == "control")}
    if args.json:
        print(json.dumps({"drills": rows, **summary}))
        return
    print(f"{'drill':8} {'got in':7} {'killed':7} {'answers':28} what")
    for r in rows:
        print(f"{r['drill']:8} {str(r['got_in']):7} {str(r['killed']):7} "
              f"{str(r['answers']):28} {r['what']}")
    print(f"attacks that got in: {summary['got_in']} of {len(attacks)}; servers killed: "
          f"{summary['killed']}; the run's own load accepted: {summary['control_loaded']}")


if __name__ == "__main__":
    main()
