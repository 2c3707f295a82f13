"""The one teacher-forced forward pass: the logits, and logprobs, of given completions
under a model, shared by the engine (stages.engines.hf: behaviour logprobs of forced
tokens), the trainer (stages.train.forward) and the tree's branch points
(stages.generate._policy). Kept outside every kind's folder, like stages.advantages, so
they import it and not each other.

The convention (gfcr.core.engine): a token's logprob is ``log_softmax(logits / T)`` at its
position, of the raw logits for ``T == 0``, in float32; padding positions hold 0 with
``mask`` false. The rows run packed (:mod:`stages.packing`: one row of every token once,
a GRPO group's prompt shared, no padding) or padded: the prompts' longest common token
prefix run once and its KV cache repeated over the batch (the shared-prefix forward of
"Prefix Grouper", 2025) when that pays, then one right-padded pass. :func:`route` weighs
the two by the cost model :mod:`stages.train.batching` plans micro-batches with, so a
micro-batch takes the path its plan counted on.

At a real vocabulary (SmolLM2: 49,152 entries) the logits are most of the memory: a
batch of 64 completions of 256 tokens holds 3.2 GB of float32 logits, and autograd keeps
them (and their log-softmax) for the backward. So :func:`completion_logprobs` never
builds them for the whole batch: it runs the model's body for the hidden states, keeps
only the completion tokens' rows, and applies the output layer a chunk of rows at a
time, each chunk under activation checkpointing when grad is on and there is more than
one chunk (its logits are rebuilt in the backward, as in Liger-Kernel's fused linear
cross-entropy, Hsu et al. 2024), so at most one chunk's float32 logits exist at once.
The chunk is sized by the device (:func:`chunk_size`): a budget of float32 logits bytes,
small on a CPU, large on a GPU where many small chunks would leave it idle; a batch whose
logits fit in one chunk is not checkpointed at all (nothing to save, one head pass
less). Models whose logits are not a plain linear map of the last hidden state
(softcapping, logit scales) take the full-logits path.

No value travels from the device to the host here (no ``.item()``, no boolean-mask
indexing, whose output size the host must learn): the completion tokens' positions are
known on the host from the lengths, so the gather and scatter use index tensors built
there, and a GPU forward is never stalled waiting for the host.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
from torch.utils.checkpoint import checkpoint

from stages import packing
from stages.packing import packed_forward

CHUNK_TOKENS = 256
"""The fewest completion tokens of a chunk (49,152 x 256 float32 logits is 50 MB)."""
LOGITS_BUDGET = {"cpu": 64 * 2**20, "cuda": 1 * 2**30}
"""Bytes of float32 logits one chunk may hold, by device type (others: the CPU's)."""
_PLAIN_HEAD = frozenset({"llama", "mistral", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe",
                         "phi3", "olmo", "olmo2", "smollm3", "gemma"})
"""Model types whose logits are ``lm_head(last hidden state)`` and nothing more."""
Entropy = Callable[[torch.Tensor], torch.Tensor]


def log_probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """The convention on a logits tensor ``[..., V]``: float32
    ``log_softmax(logits / T)``, of the raw logits when ``T == 0``."""
    logits = logits.float()
    return torch.log_softmax(logits / temperature if temperature > 0 else logits, dim=-1)


def completion_logprobs(model: Any, prompts: list[list[int]], completions: list[list[int]],
                        temperature: float = 1.0, pad_id: int = 0
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(logprobs, mask)``, both ``[B, longest completion]``: each completion token's
    logprob under the convention, 0 on padding. Differentiable when grad is enabled.
    Full-vocabulary logits exist for at most ``CHUNK_TOKENS`` tokens at once."""
    logprobs, mask, _ = completion_scores(model, prompts, completions, temperature, pad_id)
    return logprobs, mask


def chunk_size(device: torch.device, vocab: int) -> int:
    """Completion tokens per chunk of the output layer on ``device`` for a ``vocab``-wide
    head: as many as :data:`LOGITS_BUDGET` bytes of float32 logits hold, at least
    :data:`CHUNK_TOKENS` (SmolLM2's 49,152 entries: 341 tokens on a CPU, 5,461 on a GPU;
    a 259-entry byte vocabulary: 64k on a CPU, one chunk for any batch)."""
    budget = LOGITS_BUDGET.get(device.type, LOGITS_BUDGET["cpu"])
    return max(CHUNK_TOKENS, budget // (4 * max(int(vocab), 1)))


def completion_scores(model: Any, prompts: list[list[int]], completions: list[list[int]],
                      temperature: float = 1.0, pad_id: int = 0, *,
                      entropy: Entropy | None = None, chunk_tokens: int | None = None,
                      pack: bool | None = None
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``(logprobs, mask, entropies or None)``, each ``[B, longest completion]`` and 0 on
    padding: :func:`completion_logprobs` plus, when ``entropy`` is given (it maps ``[N,
    V]`` scaled logits to ``[N]``), the entropy of each token's next-token distribution.
    Computed from the hidden states ``chunk_tokens`` completion tokens at a time (None:
    :func:`chunk_size` of the model's device and vocabulary). ``pack``: the packed path
    (True, where the model allows it) or the padded one (False); None: the cheaper."""
    head = _plain_head(model)
    if head is None:
        logits, targets, mask = completion_logits(model, prompts, completions,
                                                  temperature, pad_id, pack=pack)
        ent = None if entropy is None else entropy(logits).masked_fill(~mask, 0.0)
        return gather_logprobs(logits, targets, mask), mask, ent
    hidden, targets, mask, flat = _completion_rows(model, head, prompts, completions, pad_id,
                                                   pack)
    rows = hidden.reshape(-1, hidden.shape[-1]).index_select(0, flat)
    wanted = targets.reshape(-1).index_select(0, flat)
    size = chunk_tokens or chunk_size(rows.device, head.out_features)
    recompute = len(rows) > size  # one chunk: its logits are all there is to keep
    parts = [_score_chunk(head, rows[at:at + size], wanted[at:at + size], temperature,
                          entropy, recompute) for at in range(0, len(rows), size)]
    lp = torch.cat([p[0] for p in parts]) if parts else rows.new_zeros(0, dtype=torch.float32)
    logprobs = _scatter(lp.float(), flat, mask)
    ent = None
    if entropy is not None:
        ent = _scatter(torch.cat([e for _, e in parts if e is not None]) if parts else lp,
                       flat, mask)
    return logprobs, mask, ent


def _scatter(values: torch.Tensor, flat: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``values`` (one per real token) at the flat positions ``flat`` of a zero ``[B, T]``
    float32 tensor shaped like ``mask``; differentiable, and no host sync."""
    out = torch.zeros(mask.numel(), dtype=torch.float32, device=mask.device)
    return out.index_put((flat,), values.float()).view(mask.shape)


def _plain_head(model: Any) -> torch.nn.Linear | None:
    """The output layer when the logits are ``head(body(ids))`` and nothing else, so the
    body can be run alone (``model.<base_model_prefix>``); None otherwise."""
    config = getattr(model, "config", None)  # getattr: any module with the call convention
    if getattr(config, "model_type", None) not in _PLAIN_HEAD or _sharded(model):
        return None
    head = model.get_output_embeddings()
    body = getattr(model, getattr(model, "base_model_prefix", ""), None)
    return head if isinstance(head, torch.nn.Linear) and body is not None else None


def _sharded(model: Any) -> bool:
    """Whether ``model`` is sharded by FSDP2 (stages.train.fsdp): only its root's forward
    gathers the embedding and the output layer, so it runs whole (full logits)."""
    if not torch.distributed.is_available():
        return False
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def _score_chunk(head: torch.nn.Linear, rows: torch.Tensor, targets: torch.Tensor,
                 temperature: float, entropy: Entropy | None, recompute: bool = True
                 ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Logprobs (and entropies) of one chunk of completion tokens; under checkpointing
    when grad is on and ``recompute``, so its float32 logits are freed and rebuilt in the
    backward."""
    def run(h: torch.Tensor) -> tuple[torch.Tensor, ...]:
        logits = head(h).float()
        scaled = logits / temperature if temperature > 0 else logits
        lp = torch.log_softmax(scaled, dim=-1).gather(-1, targets[:, None]).squeeze(-1)
        return (lp,) if entropy is None else (lp, entropy(scaled))

    keep = not (recompute and torch.is_grad_enabled() and rows.requires_grad)
    out = run(rows) if keep else checkpoint(run, rows, use_reentrant=False)
    return out[0], (out[1] if entropy is not None else None)


def _completion_rows(model: Any, head: torch.nn.Linear, prompts: list[list[int]],
                     completions: list[list[int]], pad_id: int, pack: bool | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(hidden, targets, mask, flat)``: the last hidden state predicting each completion
    token ``[B, T, H]``, the token ids and the mask of real tokens, both ``[B, T]``, and
    the flat indices of the real tokens in ``[B * T]`` (built on the host: no sync)."""
    body = getattr(model, model.base_model_prefix)  # getattr: transformers' own naming
    out, where = _forward(body, prompts, completions, pad_id, pack)
    picked = _pick(out.last_hidden_state, where)
    targets, mask = _targets(completions, torch.device("cpu"))
    flat = mask.reshape(-1).nonzero().squeeze(1)
    device = where.device
    return picked, targets.to(device), mask.to(device), flat.to(device)


MIN_SHARED = 8
"""Shortest common prompt prefix worth a separate forward pass."""


def completion_logits(model: Any, prompts: list[list[int]], completions: list[list[int]],
                      temperature: float = 1.0, pad_id: int = 0, pack: bool | None = None
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(logits / T, targets, mask)``: float32 logits ``[B, T, V]`` predicting each
    completion token (divided by ``T`` unless ``T == 0``), the token ids ``[B, T]`` and
    the mask of real tokens ``[B, T]``. Shared-prefix forward where it pays (see
    :func:`sequence_logprobs`), one right-padded pass otherwise. The whole batch's
    logits: for diagnostics and tests; training uses :func:`completion_scores`."""
    out, where = _forward(model, prompts, completions, pad_id, pack)
    picked = _pick(out.logits, where).float()
    targets, mask = _targets(completions, where.device)
    scaled = picked / temperature if temperature > 0 else picked
    return scaled, targets, mask


def _pick(states: torch.Tensor, where: torch.Tensor) -> torch.Tensor:
    """``[B, T, D]``: the rows of ``states`` (``[R, W, D]``, read as ``R x W`` rows) at the
    flat indices ``where`` ``[B, T]``."""
    flat = states.reshape(-1, states.shape[-1]).index_select(0, where.reshape(-1))
    return flat.view(*where.shape, states.shape[-1])


def _forward(model: Any, prompts: list[list[int]], completions: list[list[int]],
             pad_id: int, pack: bool | None = None) -> tuple[Any, torch.Tensor]:
    """``(output, where)``: one forward pass over prompt + completion, packed
    (:mod:`stages.packing`) where :func:`route` says that costs less, else padded (after a
    shared prefix of ``k`` tokens run once, when that pays); and, per completion token,
    the flat index of the output (read as ``rows x width``) that predicts it ``[B, T]``."""
    if len(prompts) != len(completions):
        raise ValueError(f"completion_logits: {len(prompts)!r} prompts but "
                         f"{len(completions)!r} completions")
    if any(not p for p in prompts):
        raise ValueError("completion_logits: every prompt needs at least one token")
    chosen = route(model, prompts, completions)
    if chosen is not None and (chosen.packs if pack is None else pack):
        return packed_forward(model, prompts, completions, packing.mode(model))
    device = next(model.parameters()).device
    k, cache = _shared_prefix(model, prompts, device)
    ids, attn, width = _suffix_batch(prompts, completions, k, pad_id)
    if cache is None:
        out = model(input_ids=ids.to(device), attention_mask=attn.to(device))
    else:
        positions = torch.arange(k, k + width, device=device).expand(len(prompts), -1)
        out = model(input_ids=ids.to(device), attention_mask=attn.to(device),
                    position_ids=positions, past_key_values=cache, use_cache=True)
    n_out = max((len(c) for c in completions), default=0)
    # completion token j of row i is predicted at suffix position len(prompt_i) - k - 1 + j
    starts = torch.tensor([len(p) - k - 1 + i * width for i, p in enumerate(prompts)],
                          device=device)
    where = starts[:, None] + torch.arange(n_out, device=device)[None, :]
    ends = torch.tensor([(i + 1) * width - 1 for i in range(len(prompts))], device=device)
    return out, torch.minimum(where, ends[:, None])


def route(model: Any, prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]]
          ) -> packing.Costs | None:
    """The two paths' costs for these rows (:func:`stages.packing.costs`; the packed one is
    taken when it is the cheaper), or None where packing is not available (a sharded
    model, a sliding window shorter than a sequence)."""
    longest = max((len(p) + len(c) for p, c in zip(prompts, completions)), default=0)
    if _sharded(model) or not packing.window_allows(model, longest):
        return None
    return packing.costs(prompts, completions, how=packing.mode(model),
                         pairs=packing.pair_cost(model), prefix=padded_prefix(model, prompts))


def padded_prefix(model: Any, prompts: Sequence[Sequence[int]]) -> int:
    """The common prefix the padded path runs once for these prompts (0: none)."""
    k = common_prefix(prompts)
    # transformers turns the cache off under gradient checkpointing in training mode
    recompute = bool(getattr(model, "is_gradient_checkpointing", False)) and model.training
    # a sharded model's ranks must run as many forwards as each other, whatever rows
    if k < MIN_SHARED or len(prompts) < 2 or recompute or _sharded(model):
        return 0
    return k


def _targets(completions: list[list[int]], device: torch.device
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded completion ids and their mask of real tokens, both ``[B, T]``."""
    n_out = max((len(c) for c in completions), default=0)
    targets = torch.zeros((len(completions), n_out), dtype=torch.long)
    mask = torch.zeros((len(completions), n_out), dtype=torch.bool)
    for i, c in enumerate(completions):
        targets[i, :len(c)] = torch.tensor(list(c), dtype=torch.long)
        mask[i, :len(c)] = True
    return targets.to(device), mask.to(device)


def gather_logprobs(logits: torch.Tensor, targets: torch.Tensor,
                    mask: torch.Tensor) -> torch.Tensor:
    """log_softmax of already-scaled ``logits`` at ``targets``; 0 where ``mask`` is false."""
    logprobs = torch.log_softmax(logits, dim=-1).gather(-1, targets[:, :, None]).squeeze(-1)
    return logprobs.masked_fill(~mask, 0.0)


def _shared_prefix(model: Any, prompts: list[list[int]], device: torch.device
                   ) -> tuple[int, Any]:
    """``(k, cache)``: the common prefix length and its KV cache repeated over the batch,
    or ``(0, None)`` when sharing does not pay or the cache cannot be repeated."""
    k = padded_prefix(model, prompts)
    if not k:
        return 0, None
    shared = model(input_ids=torch.tensor([prompts[0][:k]], device=device), use_cache=True)
    cache = shared.past_key_values
    if not hasattr(cache, "batch_repeat_interleave"):  # transformers' cache API differs by version
        return 0, None
    cache.batch_repeat_interleave(len(prompts))
    return k, cache


def common_prefix(prompts: Sequence[Sequence[int]]) -> int:
    """Length of the longest common prefix, leaving every prompt at least one token."""
    first = prompts[0]
    k = min(len(p) for p in prompts) - 1
    for p in prompts[1:]:
        j = 0
        while j < k and p[j] == first[j]:
            j += 1
        k = j
    return max(k, 0)


def _suffix_batch(prompts: list[list[int]], completions: list[list[int]], k: int,
                  pad_id: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Right-padded (prompt[k:] + completion) ids, and the mask over prefix + suffix."""
    rows = [list(p[k:]) + list(c) for p, c in zip(prompts, completions)]
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(rows), k + width), dtype=torch.long)
    attn[:, :k] = 1
    for i, r in enumerate(rows):
        ids[i, :len(r)] = torch.tensor(r, dtype=torch.long)
        attn[i, k:k + len(r)] = 1
    return ids, attn, width
