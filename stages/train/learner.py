"""The GRPO learner: turns a batch into a policy update (see :mod:`stages.train.grpo` for
the method and its options).

One update: advantages over the batch's groups (with the ``rewards`` components for
estimators that declare so; a row's advantage override, where it carries one, used as
is), the rows with signal, their loss masks (forced tokens out, the token selector's
share kept: :mod:`stages.train.masks`), a no-grad pass at the current weights where
needed (proximal logprobs of off-policy rows, :mod:`stages.train.offpolicy`; token
entropies for the token selector), the
reference logprobs when ``kl_coef > 0``, then ``epochs`` optimizer steps, each over
micro-batches (:mod:`stages.train.batching`) whose losses are divided by whole-batch counts
so the accumulated gradient is the full-batch gradient. The forward passes of the policy,
with a gradient and without, are :mod:`stages.train.passes`.

The device and dtype are read from the trained weights at every update, never kept from
the build (:mod:`stages.train.device`): the engine places the model after the learner
exists. Inside the micro-batch loop nothing waits for the device: losses and statistics
stay tensors until the update ends (their weights are counted on the host).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from gfcr.core.policy import Policy
from gfcr.core.stage import StepContext, TrainResult
from stages.train import masks as loss_masks
from stages.train import offpolicy
from stages.train import work as work_rows
from stages.train.work import Work
from stages.train import device as placing
from stages.train.batching import waste
from stages.train.memory import PeakMemory, checkpoint_layers
from stages.train.lora import LoraTraining
from stages.train.optim import bf16_problem, lr_factor, set_lr
from stages.train.options import LearnerOptions
from stages.train.passes import Passes
from stages.train.ranks import OneProcess, Ranks


class GRPOLearner:
    """Applies :class:`GRPO` updates to the run's policy, which it updates in place. It
    never touches the engine: the learner service (gfcr.runner.inprocess.LocalLearner) hands
    the new weights out as a handle, which the generator loads."""

    def __init__(self, spec: LearnerOptions, policy: Policy, *, seed: int,
                 lora: LoraTraining | None = None) -> None:
        self.spec, self.policy, self.seed = spec, policy, seed
        self.updates = 0
        self.reference: torch.nn.Module | None = None
        self.lora = lora
        """The LoRA adapter that trains instead of every weight (None: full training)."""
        self.ranks: Ranks = OneProcess()
        """The processes an update's rows are shared between (stages.train.ranks); a
        sharded learner (stages.train.fsdp) sets its own."""
        self._pinned: torch.device | None = None
        self.passes = Passes(spec, policy, lambda: self.device)
        """The policy's forward passes over an update's rows (stages.train.passes)."""
        self.optimizer = self._new_optimizer()
        self._placed = placing.placement(self._trained())
        if spec.gradient_checkpointing:
            checkpoint_layers(policy.model, spec.label)

    @property
    def device(self) -> torch.device:
        """The policy's weights' device, read at every use (the engine may move the
        model), unless a sharded learner pinned its compute device (offloaded shards)."""
        if self._pinned is not None:
            return self._pinned
        return placing.placement(self.policy.model.parameters())[0]

    @device.setter
    def device(self, value: torch.device) -> None:
        self._pinned = value

    def _trained(self) -> list[torch.nn.Parameter]:
        """The weights the optimizer updates: the adapter's once it is in, else all."""
        lora = self.lora if self.lora is not None and self.lora.active else None
        return lora.parameters() if lora else list(self.policy.model.parameters())

    def _place(self) -> None:
        """Fit the update to where the model is now (bf16, optimizer, KL reference)."""
        problem = bf16_problem(self.device) if self.spec.precision == "bf16" else None
        if problem:
            raise ValueError(f"stage {self.spec.label!r}: precision='bf16': {problem}")
        self.optimizer, self._placed = placing.fitted(self.optimizer, self._placed,
                                                      self._trained(), self._new_optimizer)
        if self.reference is not None and self._pinned is None:
            self.reference.to(self.device)

    # ------------------------------------------------------------------ update

    def update(self, ctx: StepContext | None, batch: pa.Table) -> TrainResult:
        """Advantages, then ``epochs`` clipped-PG steps; the step's peak memory too."""
        self.start_adapter()
        self._place()
        with PeakMemory(self.device) as peak:
            result = self._update(ctx, batch)
        self.optimizer.zero_grad(set_to_none=True)  # memory for the engine until the next
        if self.spec.offload_optimizer:
            placing.move_state(self.optimizer, torch.device("cpu"))
        result.metrics.update(peak.metrics())
        return result

    def _update(self, ctx: StepContext | None, batch: pa.Table) -> TrainResult:
        rewards = work_rows.rewards(batch, self.spec.label)
        marks = loss_masks.for_batch(batch, stage=self.spec.label)
        adv = self._advantages(batch, rewards, marks)
        metrics = {"reward_mean": float(rewards.mean()) if len(rewards) else 0.0,
                   "adv_abs_mean": float(np.abs(adv).mean()) if len(adv) else 0.0}
        work = self.prepare(ctx, batch, adv, marks)
        metrics.update(work.metrics)
        metrics["packing_waste"] = waste(work.prompts, work.completions,
                                         self._micro_batches(work), model=self.policy.model)
        position = ctx.step if ctx is not None else self.updates
        metrics["lr"] = self.spec.lr * lr_factor(position, self.spec.lr_schedule,
                                                 warmup=self.spec.warmup_steps,
                                                 total=self.spec.total_steps)
        if not work.prompts:
            metrics.update(loss=0.0, clip_frac=0.0, grad_norm=0.0, approx_kl=0.0,
                           ratio_mean=1.0)
            return TrainResult(advantages=adv.tolist(), metrics=metrics)
        set_lr(self.optimizer, metrics["lr"])
        epochs = [self._epoch(work) for _ in range(self.spec.epochs)]
        self.updates += 1
        for key in epochs[0]:
            metrics[key] = float(np.mean([e[key] for e in epochs]))
        return TrainResult(advantages=adv.tolist(), metrics=metrics)

    def loss_and_gradients(self, ctx: StepContext | None, batch: pa.Table) -> float:
        """The loss of ``batch`` at the current weights with its gradient left in the
        parameters' ``.grad`` (accumulated over micro-batches); no optimizer step. For
        diagnostics and tests."""
        self.start_adapter()
        self._place()
        marks = loss_masks.for_batch(batch, stage=self.spec.label)
        adv = self._advantages(batch, work_rows.rewards(batch, self.spec.label), marks)
        work = self.prepare(ctx, batch, adv, marks)
        self.optimizer.zero_grad(set_to_none=True)
        return self._accumulate(work)[0] if work.prompts else 0.0

    def prepare(self, ctx: StepContext | None, batch: pa.Table, adv: np.ndarray,
                marks: loss_masks.BatchMarks | None = None) -> Work:
        """The rows to train on with their loss masks, "old" logprobs, IS weights and
        reference logprobs (no-grad forward passes at the current weights where needed);
        ``marks``: the batch's (:func:`stages.train.masks.for_batch`), read if not given."""
        spec, label = self.spec, self.spec.label
        marks = marks or loss_masks.for_batch(batch, stage=label)
        self.policy.model.train()
        carries = spec.kl_coef > 0 or spec.entropy_coef > 0  # every row has a gradient
        rows, prompts, completions, behaviour, hint = work_rows.active_rows(
            batch, marks.signal(adv), label, carries, marks.masks)
        version = ctx.policy_version if ctx is not None else self.policy.version
        stale = offpolicy.staleness(batch, rows, version)
        off = offpolicy.off_policy(batch, rows, stale)
        ratio = marks.keep_ratio
        use_prox = spec.tis_cap is not None and bool(off.any())
        use_entropy = ratio is not None and ratio < 1.0
        forward = [i for i in range(len(rows)) if use_entropy or (use_prox and off[i])]
        prox, entropy = self.passes.no_grad(prompts, completions, forward, use_entropy)
        row_adv = [float(adv[i]) for i in rows]
        masks = (loss_masks.selected_masks(hint, row_adv, entropy, ratio, spec.token_selector)
                 if use_entropy else hint)
        work = Work(prompts=prompts, completions=completions, adv=row_adv, masks=masks,
                     old=[prox[i] if use_prox and off[i] else behaviour[i]
                          for i in range(len(rows))])
        work.token_adv = marks.token_advantages(rows, row_adv)
        if use_prox:
            work.weights = work_rows.is_weights(work, behaviour, off,
                                                float(spec.tis_cap))  # type: ignore[arg-type]
        n_tokens = sum(len(c) for c in completions)
        work.metrics = {"n_seqs": float(len(rows)), "n_tokens": float(n_tokens),
                        "loss_token_share": (float(sum(int(m.sum()) for m in masks)) / n_tokens
                                             if n_tokens else 0.0),
                        **offpolicy.metrics(off, stale, work.weights or
                                            [np.ones(len(m)) for m in masks], masks,
                                            spec.tis_cap)}
        work_rows.drop_empty(work)
        if spec.kl_coef > 0 and work.prompts:
            work.ref = self._reference_logprobs(work)
        return work

    # ------------------------------------------------------------------ pieces

    def _new_optimizer(self) -> torch.optim.Optimizer:
        """AdamW over the weights that train (fused on CUDA, stages.train.device)."""
        return placing.adamw(self._trained(), self.spec.lr)

    def start_adapter(self) -> None:
        """Inject the LoRA adapter at the first update (after any warm start), with an
        optimizer over it alone."""
        if self.lora is not None and self.lora.start():
            self.optimizer = self._new_optimizer()

    def _advantages(self, batch: pa.Table, rewards: np.ndarray,
                    marks: loss_masks.BatchMarks | None = None) -> np.ndarray:
        """The estimator's advantages over the batch's groups, replaced by the advantage
        override on rows that carry one (:meth:`stages.train.masks.BatchMarks.advantages`)."""
        adv = work_rows.estimated_advantages(batch, rewards, self.spec.advantage,
                                             self.spec.label)
        return (marks or loss_masks.for_batch(batch, stage=self.spec.label)).advantages(adv)

    def _epoch(self, work: Work) -> dict[str, float]:
        """One optimizer step, gradients accumulated over micro-batches."""
        self.optimizer.zero_grad(set_to_none=True)
        total, stats = self._accumulate(work)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.policy.model.parameters(),
                                                   self.spec.max_grad_norm)
        self.optimizer.step()
        return {"loss": total, "grad_norm": placing.scalar(grad_norm), **stats}

    def _accumulate(self, work: Work) -> tuple[float, dict[str, float]]:
        """Backward of every micro-batch; the loss and token-weighted statistics."""
        spec, device = self.spec, self.device
        denominator = work_rows.denominator(work, spec.aggregation)
        norm = work_rows.norm(work, spec.aggregation, spec.norm_tokens)
        total = torch.zeros((), dtype=torch.float64, device=device)
        n_all = 0.0
        weighted: dict[str, torch.Tensor] = {}
        rows = list(range(len(work.prompts)))
        lengths = [len(work.prompts[i]) + len(work.completions[i]) for i in rows]
        for part in self.ranks.parts(rows, lengths, lambda r: self._micro_batches(work, r)):
            if part is None:
                self._idle(work)
                continue
            new, mask, entropy = self.passes.forward(work, part, grad=True)
            loss, stats = work_rows.micro_loss(
                work, part, new, entropy, denominator=denominator, max_tokens=norm,
                clip_low=spec.clip_low, clip_high=spec.clip_high,
                aggregation=spec.aggregation, ratio_level=spec.ratio_level,
                kl_coef=spec.kl_coef, entropy_coef=spec.entropy_coef)
            loss.backward()
            total += loss.detach()
            n = float(sum(int(work.masks[i].sum()) for i in part))  # on the host: no sync
            n_all += n
            for key, value in stats.items():
                weighted[key] = weighted.get(key, 0.0) + value.detach().double() * n
        host = placing.floats({"loss": total, **{f"stat/{k}": v for k, v in weighted.items()}})
        sums = self.ranks.total({**host, "n": n_all})
        return sums["loss"], {k[5:]: v / max(sums["n"], 1.0) for k, v in sums.items()
                              if k.startswith("stat/")}

    def _idle(self, work: Work) -> None:
        """A micro-batch of zero loss (a forward and backward of the first row times 0):
        what a process with no rows left runs while the others train (stages.train.ranks)."""
        new, mask, _ = self.passes.forward(work, [0], grad=True, entropy=False)
        (torch.where(mask, new, torch.zeros_like(new)).sum() * 0.0).backward()

    def _micro_batches(self, work: Work, subset: list[int] | None = None) -> list[list[int]]:
        """The micro-batches of ``subset`` of ``work``'s rows (all when None)."""
        return self.passes.micro_batches(work, subset)

    def logprobs(self, prompts: list[list[int]], completions: list[list[int]],
                 temperature: float) -> list[list[float]]:
        """Teacher-forced ``log_softmax(logits / T)`` of each completion token at the
        current weights (gfcr.core.services.Learner.logprobs)."""
        return self.passes.teacher_forced(prompts, completions, temperature)

    def _reference_logprobs(self, work: Work) -> list[np.ndarray]:
        """Logprobs of every row under the frozen reference (made at the first update;
        with LoRA the base itself, the adapter switched off)."""
        lora = self.lora if self.lora is not None and self.lora.active else None
        if self.reference is None and lora is None:
            self.reference = self.ranks.frozen_copy(self.policy.model)
        return self.passes.reference(work, self.reference, lora)

    # ------------------------------------------------------------------ state

    def state_dict(self) -> dict[str, Any]:
        """Everything the next update depends on: model weights, optimizer state, the
        update count and the frozen reference (None until made). The learning rate is a
        pure function of the step (:func:`stages.train.optim.lr_factor`), so there is no
        scheduler state; the learner draws no random numbers. With LoRA the weights
        are the adapter's, checkpointed as the weights file (:meth:`save_adapter`), so
        there is no ``model`` entry."""
        state = {"optimizer": self.optimizer.state_dict(), "updates": self.updates,
                 "reference": None if self.reference is None else self.reference.state_dict()}
        if self.lora is None or not self.lora.active:
            state["model"] = self.policy.model.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "model" in state:
            self.policy.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.updates = int(state["updates"])
        self.reference = None
        if state.get("reference") is not None:
            self.reference = self.ranks.frozen_copy(self.policy.model)
            self.reference.load_state_dict(state["reference"])

    # ------------------------------------------------------------------ LoRA weights

    @property
    def trains_adapter(self) -> bool:
        return self.lora is not None

    def adapter_handle(self, version: int) -> Any:
        """The trained adapter as a weight handle (gfcr.core.capabilities.AdapterWeights);
        None without one (full training, or LoRA before its first update)."""
        return None if self.lora is None else self.lora.handle(version)

    def save_adapter(self, path: Path) -> bool:
        return self.lora is not None and self.lora.save(path)

    def load_adapter(self, path: Path) -> bool:
        if self.lora is None or not self.lora.load(path):
            return False
        self.optimizer = self._new_optimizer()  # over the adapter just injected
        return True

