"""The HF transformers engine: a KV-cached, segmented decode loop over a shared policy.

Runs on CPU or GPU over any causal LM with the transformers call convention. It shares
``policy.model`` with the trainer in-process: the trainer updates that module and calls
``update_weights()``, which only advances the version (with a state dict it loads it
first). The version lives on the policy (``policy.version``), so engine and learner agree
on it. Requests are decoded in waves of at most ``max_batch`` sequences, left-padded, with
position ids counted from each sequence's first real token, so a batched greedy result
equals the single-sequence one. Before each wave the hook's ``wave(keys)`` learns which
requests start (``gfcr.core.engine.SegmentHook``), so hooks that count groups
(APRIL, ARRoL) work over several waves. Every ``segment_tokens`` new tokens the in-flight
hook may stop (finish_reason "aborted", kept as a partial) or prune ("pruned") sequences;
finished ones leave the batch and the KV cache (an index selection) as soon as that saves
more compute than the copy costs. A stop string ends a sequence once it appears in the
completion text ending after the prefix; the token that completed it stays.

Logprob convention: the logprob of a sampled token is ``log_softmax(logits / T)`` at that
token for ``T > 0`` and ``log_softmax(logits)`` for greedy, taken *before* top-p
truncation. That is exactly what a teacher-forced forward pass at the same temperature
computes; :mod:`stages.engines.hf_sampling`'s ``token_logprobs`` is that pass
(:mod:`stages.logprobs`, which the trainer and Hints use too). It equals vLLM's
``processed_logprobs`` at ``top_p=1``; with ``top_p<1`` vLLM renormalises over the
nucleus and this engine does not.
With ``SamplingParams.top_logprobs=k`` (the ``top_k`` capability) each step also reports
the k largest entries of the same log-softmax row (TreeRollout's branch points).

Sampling is seeded with a ``torch.Generator`` (``SamplingParams.seed``, else one seeded
from the engine's build seed and advanced by every call), so the same seed and requests
give identical outputs. A sequence's samples depend on the other sequences of its wave.

>>> from gfcr.core.engine import GenRequest, SamplingParams
>>> from stages.engines.tiny import TinyLlama
>>> policy = TinyLlama(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
>>> engine = HF(device="cpu").build(policy.build(seed=0), seed=0)
>>> [out] = engine.generate([GenRequest(key=0, prompt_ids=engine.encode("1+1="))],
...                         SamplingParams(max_tokens=4, temperature=0.0))
>>> len(out.completion_ids) == len(out.logprobs) <= 4, out.finish_reason in ("stop", "length")
(True, True)
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, ClassVar, Literal

import torch
from pydantic import Field
from transformers import DynamicCache

from gfcr.core.engine import (GenOutput, GenRequest, SamplingParams, SegmentHook, encode_prompt,
                              stop_token_ids)
from gfcr.core.policy import Policy
from gfcr.core.stage import Spec
from gfcr.core.registry import register
from stages import lora
from stages.engines import teacher
from stages.engines._seqs import Seq, ask_hook, check_keys, context_of, new_seq, output
from stages.engines.hf_sampling import sample_next, top_entries
from stages.logprobs import log_probs


@register("engine")
class HF(Spec):
    """The HF transformers engine (CPU or GPU) with a hand-written KV-cached decode loop.

    ``dtype`` is the compute dtype: the weights stay as the policy holds them (shared
    with the trainer); a lower precision than float32 weights runs under autocast.
    """

    type: Literal["hf"] = "hf"
    capabilities: ClassVar[frozenset[str]] = frozenset(
        {"segments", "continuation", "top_k", "teacher_forcing"})
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where the model runs; ``auto`` picks CUDA when torch sees it."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Compute dtype (autocast below the weights' float32)."""
    max_batch: int = Field(256, ge=1)
    """Most sequences decoded at once; more requests are processed in waves."""
    threads: int | None = Field(1, ge=1)
    """torch intra-op CPU threads (None: torch's default). One suits small models: on a
    busy 2-core machine two threads spin on each other and ran SFT 11x slower here."""

    def build(self, policy: Policy, *, seed: int) -> "HFEngine":
        """Move the policy's model to the device (in place: the trainer shares it)."""
        device = self.device
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        elif device == "cuda" and not torch.cuda.is_available():
            raise ValueError("hf engine: device='cuda' but torch sees no CUDA device")
        model_dtype = next(policy.model.parameters()).dtype
        want = getattr(torch, self.dtype)  # a torch dtype by its config name
        if want != model_dtype and model_dtype != torch.float32:
            raise ValueError(f"hf engine: dtype={self.dtype!r} but the policy weights are "
                             f"{model_dtype}; only float32 weights can run at another dtype")
        if device == "cpu" and self.threads is not None:
            torch.set_num_threads(self.threads)
        policy.model.to(device)
        autocast = None if want == model_dtype else want
        return HFEngine(policy, autocast=autocast, max_batch=self.max_batch, seed=seed)


# --------------------------------------------------------------------------- engine


class HFEngine:
    """:class:`gfcr.core.engine.Engine` over a :class:`Policy` shared with the trainer."""

    def __init__(self, policy: Policy, *, autocast: torch.dtype | None, max_batch: int,
                 seed: int) -> None:
        self._policy = policy
        self._autocast = autocast
        self._max_batch = max_batch
        self._seed = seed
        self._gen = torch.Generator(device=self.device)
        self._gen.manual_seed(seed)

    @property
    def version(self) -> int:
        return self._policy.version

    @property
    def policy(self) -> Policy:
        return self._policy

    def context_length(self) -> int | None:
        """The policy's context (gfcr.core.capabilities.ContextLength)."""
        return context_of(self._policy.model)

    @property
    def device(self) -> torch.device:
        """Where the policy's weights are now (read at every use: the model may move)."""
        return next(self._policy.model.parameters()).device

    @property
    def sleep_mode(self) -> bool:
        """Whether the loop calls :meth:`sleep` before the learner's update and
        :meth:`wake_up` after it (gfcr.core.capabilities.EngineSleep): on a GPU."""
        return self.device.type == "cuda"

    def sleep(self) -> None:
        """Give the memory the last decode's KV cache held back to the driver before the
        learner's update (torch keeps freed blocks cached from other allocators)."""
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def wake_up(self) -> None:
        """Nothing to restore: the weights are the learner's, each wave builds its cache."""

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
        ``teacher_forcing`` capability, :mod:`stages.engines.teacher`), in its dtype."""
        with self._autocast_ctx():
            return teacher.forced_logprobs(self._policy, prompt_ids, ids, temperature)

    def get_rng_state(self) -> torch.Tensor:
        """State of the sampling generator used when ``SamplingParams.seed`` is None;
        checkpoints save it so a resumed run draws what an uninterrupted one would."""
        return self._gen.get_state()

    def set_rng_state(self, state: torch.Tensor) -> None:
        self._gen.set_state(state.cpu())  # a ByteTensor on the CPU for any device

    def update_weights(self, state: Any | None = None) -> int:
        """Load ``state`` if given, then advance the version: a state dict in place, or
        a LoRA adapter's tensors (:class:`stages.lora.AdapterState`) into the model's
        adapter layers (injected the first time), the base left as it is."""
        if isinstance(state, lora.AdapterState):
            lora.apply(self._policy.model, state)
        elif state is not None:
            self._policy.model.load_state_dict(state)
        self._policy.version += 1
        return self._policy.version

    def generate(self, requests: list[GenRequest], params: SamplingParams,
                 on_segment: SegmentHook | None = None) -> list[GenOutput]:
        """Generate every request, in waves of ``max_batch``; outputs in request order."""
        t0 = time.perf_counter()
        check_keys(requests)
        seqs = [new_seq(r, params) for r in requests]
        if self._gen.device != self.device:  # the model moved: a sampler there, reseeded
            self._gen = torch.Generator(device=self.device).manual_seed(self._seed)
        gen = self._gen
        if params.seed is not None:
            gen = torch.Generator(device=self.device)
            gen.manual_seed(params.seed)
        todo = [s for s in seqs if s.reason is None]
        at_once = [s.req.key for s in seqs if s.reason is not None]
        model = self._policy.model
        was_training = model.training
        model.eval()
        try:
            with torch.inference_mode(), self._autocast_ctx():
                for at in range(0, len(todo), self._max_batch):
                    wave = todo[at:at + self._max_batch]
                    if on_segment is not None:  # the hook learns which requests have started
                        on_segment.wave([s.req.key for s in wave] + (at_once if at == 0 else []))
                    _Wave(self, wave, params, gen, on_segment, t0).run()
        finally:
            model.train(was_training)
        return [output(s, self.version, params) for s in seqs]

    def _autocast_ctx(self) -> contextlib.AbstractContextManager:
        if self._autocast is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self._autocast)


class _Wave:
    """Decode up to ``max_batch`` sequences together until each one finishes."""

    def __init__(self, engine: HFEngine, seqs: list[Seq], params: SamplingParams,
                 gen: torch.Generator, hook: SegmentHook | None, t0: float) -> None:
        self.engine, self.params, self.gen, self.hook, self.t0 = engine, params, gen, hook, t0
        self.live = seqs
        self.model = engine.policy.model
        self.ends = stop_token_ids(engine.policy.tokenizer)  # EOS and end-of-turn ids
        # getattr: transformers config attribute, absent in some versions
        self.sdpa = getattr(self.model.config, "_attn_implementation", None) == "sdpa"
        self.stops = tuple(x for x in params.stop if x)  # "" would stop at once
        if self.stops:
            for s in seqs:
                s.scan_from = len(engine.decode(s.req.prefix_ids))

    def run(self) -> None:
        logits = self._prefill()
        step = 0
        while True:
            logp = log_probs(logits, self.params.temperature)
            tok, lp = sample_next(logp, self.params, self.gen)
            step += 1
            toks, lps = torch.stack((tok.double(), lp.double())).tolist()  # one sync
            self._record([int(t) for t in toks], lps, top_entries(logp, self.params.top_logprobs))
            if self.hook is not None and step % self.params.segment_tokens == 0:
                self._ask_hook()
            keep = [i for i, s in enumerate(self.live) if s.reason is None]
            if not keep:
                return
            if len(keep) < len(self.live) and self._worth_shrinking(keep):
                self._shrink(keep)
                tok = tok[torch.tensor(keep, device=tok.device)]
            logits = self._decode(tok)

    def _worth_shrinking(self, keep: list[int]) -> bool:
        """Whether dropping finished rows saves more than the copy costs (about one step
        of the batch); a finished row left in costs 1/batch of each step to come."""
        finished = len(self.live) - len(keep)
        to_come = max(self.live[i].budget - len(self.live[i].ids) for i in keep)
        return finished * to_come >= len(self.live)

    def _prefill(self) -> torch.Tensor:
        """One pass over prompt+prefix, left-padded; sets up cache, mask and positions."""
        rows = [s.req.prompt_ids + s.req.prefix_ids for s in self.live]
        width = max(len(r) for r in rows)
        longest = max(s.budget for s in self.live)
        device = self.engine.device
        ids = torch.full((len(rows), width), self.engine.policy.tokenizer.pad_token_id,
                         dtype=torch.long)
        mask = torch.ones((len(rows), width + longest), dtype=torch.bool)
        for i, r in enumerate(rows):
            ids[i, width - len(r):] = torch.tensor(r, dtype=torch.long)
            mask[i, :width - len(r)] = False
        self.padded = any(len(r) < width for r in rows)
        self.mask = mask.to(device)
        pos = (self.mask[:, :width].long().cumsum(-1) - 1).clamp(min=0)
        self.pos = pos[:, -1:] + 1
        self.length = width
        self.cache = DynamicCache(config=self.model.config)
        out = self.model(input_ids=ids.to(device),
                         attention_mask=self.mask[:, :width] if self.padded else None,
                         position_ids=pos, past_key_values=self.cache, use_cache=True,
                         logits_to_keep=1)
        return out.logits[:, -1, :]

    def _decode(self, tok: torch.Tensor) -> torch.Tensor:
        """One step for every live sequence; the mask is a view, never rebuilt."""
        self.length += 1
        mask = None
        if self.padded:
            mask = self.mask[:, :self.length]
            if self.sdpa:
                mask = mask[:, None, None, :]  # sdpa's own bool format: skips mask building
        out = self.model(input_ids=tok[:, None], attention_mask=mask, position_ids=self.pos,
                         past_key_values=self.cache, use_cache=True)
        self.pos = self.pos + 1
        return out.logits[:, -1, :]

    def _shrink(self, keep: list[int]) -> None:
        """Drop finished rows from the cache, mask and positions."""
        index = torch.tensor(keep, device=self.mask.device)
        self.cache.batch_select_indices(index)
        self.mask = self.mask.index_select(0, index)
        self.pos = self.pos.index_select(0, index)
        self.live = [self.live[i] for i in keep]
        if self.padded and bool(self.mask[:, :self.length].all()):
            self.padded = False

    def _record(self, toks: list[int], lps: list[float],
                tops: list[list[tuple[int, float]]] | None) -> None:
        """Append the step's tokens (and top-k pairs); finish on a stop token (EOS, end of
        turn), stop string or budget."""
        now = time.perf_counter() - self.t0
        for i, (s, t, lp) in enumerate(zip(self.live, toks, lps)):
            if s.reason is not None:  # finished, still in the batch until a shrink
                continue
            s.ids.append(t)
            s.logprobs.append(lp)
            if tops is not None:
                s.tops.append(tops[i])
            if t in self.ends or (self.stops and self._hit_stop(s)):
                s.reason = "stop"
            elif len(s.ids) >= s.budget:
                s.reason = "length"
            if s.reason is not None:
                s.seconds = now

    def _hit_stop(self, s: Seq) -> bool:
        """Whether a stop string ends in the text this call added (it may start in the
        prefix). Decodes the whole completion: token boundaries need not be char ones."""
        text = self.engine.decode(s.req.prefix_ids + s.ids)
        hit = any(text.find(x, max(0, s.scan_from - len(x) + 1)) >= 0 for x in self.stops)
        s.scan_from = len(text)
        return hit

    def _ask_hook(self) -> None:
        """Show the unfinished sequences to the hook and apply its decisions; keys it
        returns that are not in flight (finished earlier, other waves) are ignored."""
        if self.hook is not None:
            ask_hook(self.hook, [s for s in self.live if s.reason is None],
                     time.perf_counter() - self.t0)
