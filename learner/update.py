"""The update step: epochs x minibatches over a flat batch, shared by every algorithm.

Algorithms differ in their batch and loss (`learner/algorithms/`); the loop around the loss
handles the device permutation, gradient accumulation, autocast + GradScaler, global grad-norm
clipping, skipped-step counting and the target-KL early stop.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from ..contracts.config import LearnerConfig
from ..learner.device import DeviceContext
from ..learner.distributed import mean_across_learners
from ..learner.precision import amp_enabled
from ..policy.actor_critic import STATE
from ..policy.protocol import EnvPolicy

Batch = dict[str, Tensor]
LossFn = Callable[[EnvPolicy, Batch], tuple[Tensor, dict[str, Tensor]]]


@dataclass
class UpdateResult:
    """Means over the optimizer steps taken, plus counters."""

    stats: dict[str, float] = field(default_factory=dict)
    optimizer_steps: int = 0
    skipped_steps: int = 0
    epochs_run: int = 0
    samples: int = 0


def _optimizer_step(
    params: list[nn.Parameter], optimizer: torch.optim.Optimizer, scaler: object | None, max_grad_norm: float
) -> tuple[Tensor, bool]:
    """Clip and step; returns (grad_norm, skipped). A non-finite gradient never reaches the weights.

    With data-parallel learners the (still scaled) gradients were averaged by DDP in the backward
    pass, so an inf on one replica reaches all of them and every replica takes the same skip
    decision.
    """
    if scaler is not None:
        scaler.unscale_(optimizer)  # type: ignore[attr-defined]
    grad_norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
    if scaler is not None:
        before = scaler.get_scale()  # type: ignore[attr-defined]
        scaler.step(optimizer)  # type: ignore[attr-defined]  # skips internally on inf/nan
        scaler.update()  # type: ignore[attr-defined]
        return grad_norm, scaler.get_scale() < before  # type: ignore[attr-defined]
    if not torch.isfinite(grad_norm):  # host sync: the skip decision must be exact
        optimizer.zero_grad(set_to_none=True)
        return grad_norm, True
    optimizer.step()
    return grad_norm, False


def minibatch_order(
    size: int, seq_len: int | None, device: torch.device, generator: torch.Generator | None
) -> Tensor:
    """A permutation of the flat batch's B rows for one epoch. Flat (`seq_len` None): shuffled
    steps. Sequences: the batch is time-major [T = seq_len, E] flattened (row t * E + e), so the
    order is the E columns shuffled, one after another, each its T steps in time order: any slice
    of a multiple of T rows is whole sequences (`sequence_view` makes it [T, k])."""
    if seq_len is None:
        return torch.randperm(size, device=device, generator=generator)
    columns = size // seq_len
    return column_rows(seq_len, columns, torch.randperm(columns, device=device, generator=generator))


def column_rows(seq_len: int, columns: int, order: Tensor) -> Tensor:
    """The rows of a time-major [T = seq_len, E = columns] batch flattened (row t * E + e), column
    by column in `order` [k], each column's T steps in time order: [k * T]."""
    t = torch.arange(seq_len, device=order.device)
    return (t.unsqueeze(0) * columns + order.unsqueeze(1)).flatten()  # [k, T]: row t * E + order[c]


def sequence_view(t: Tensor, seq_len: int) -> Tensor:
    """Rows of a sequence minibatch [k * T, ...] (columns one after another, each in time order) as
    time-major [T, k, ...]."""
    return t.reshape(-1, seq_len, *t.shape[1:]).transpose(0, 1)


def run_update(
    model: EnvPolicy,
    optimizer: torch.optim.Optimizer,
    batch: Batch,
    loss_fn: LossFn,
    cfg: LearnerConfig,
    dev: DeviceContext,
    scaler: object | None = None,
    generator: torch.Generator | None = None,
    seq_len: int | None = None,
    replicas: nn.Module | None = None,
) -> UpdateResult:
    """Epochs x minibatches of `loss_fn` over a flat batch whose fields are [B, ...] on dev.

    `replicas`: the model as DDP wraps it in a learner group (`data_parallel`): the loss runs
    through it, and each micro-batch's gradients are averaged across the replicas as its
    backward pass runs (a static graph, which DDP's `no_sync` does not allow: an env policy's
    gradients are small, and the sum of averages is the average of the sums).

    B must be a multiple of cfg.batch_size (the config validates it), so every minibatch has the
    same shape. With `seq_len` (learner.minibatch=sequences) the batch is time-major [T, E]
    flattened and minibatches are whole columns (`minibatch_order`). Statistics accumulate on the
    device and are read once at the end (one host sync).
    """
    size = batch["mask"].shape[0]
    num_minibatches = size // cfg.batch_size
    micro = cfg.batch_size // cfg.grad_accum_steps
    params = [p for p in model.parameters() if p.requires_grad]
    model.train()
    totals: dict[str, Tensor] = {}
    result = UpdateResult()
    grad_norms: list[Tensor] = []
    for _ in range(cfg.epochs):
        perm = minibatch_order(size, seq_len, dev.device, generator)
        epoch_kl = torch.zeros((), device=dev.device)
        for mb in range(num_minibatches):
            optimizer.zero_grad(set_to_none=True)
            for k in range(cfg.grad_accum_steps):
                start = mb * cfg.batch_size + k * micro
                idx = perm[start : start + micro]
                micro_batch = {name: t.index_select(0, idx) for name, t in batch.items() if name != STATE}
                if STATE in batch:  # per column: a sequence's row at t = 0 is its column's index
                    micro_batch[STATE] = batch[STATE].index_select(0, idx.view(-1, seq_len or 1)[:, 0])
                with dev.autocast(amp_enabled(cfg), cfg.amp_dtype):
                    loss, stats = (
                        loss_fn(model, micro_batch) if replicas is None else replicas(loss_fn, micro_batch)
                    )
                scaled = loss / cfg.grad_accum_steps
                (scaler.scale(scaled) if scaler is not None else scaled).backward()  # type: ignore[attr-defined]
                for name, value in stats.items():
                    totals[name] = totals.get(name, 0.0) + value.float() / cfg.grad_accum_steps
                epoch_kl = epoch_kl + stats["approx_kl"] / (cfg.grad_accum_steps * num_minibatches)
            grad_norm, skipped = _optimizer_step(params, optimizer, scaler, cfg.max_grad_norm)
            grad_norms.append(grad_norm.float())
            result.optimizer_steps += 1
            result.skipped_steps += int(skipped)
            result.samples += cfg.batch_size
        result.epochs_run += 1
        # host sync, once per epoch; averaged so every data-parallel replica stops together
        if cfg.target_kl is not None and float(mean_across_learners(epoch_kl)) > 1.5 * cfg.target_kl:
            break
    steps = max(result.optimizer_steps, 1)
    result.stats = {name: float(total) / steps for name, total in totals.items()}
    norms = torch.stack(grad_norms)
    finite = norms[torch.isfinite(norms)]
    result.stats["grad_norm"] = float(finite.mean()) if finite.numel() else float("nan")
    return result
