"""Data-parallel learners: one process group across N learner actors (HCCL on NPUs, NCCL on GPUs,
gloo on CPUs, chosen by the device layer). Each learner trains on its share of the segments;
torch's DDP averages the gradients before every optimizer step, so all replicas hold identical
weights (a causal LM is sharded over the same group instead: `learner/lm/sharding.py`).
No Ray here: the ranks call these with the rank and the address the learner group gives them.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ..learner.device import DeviceContext
from ..policy.normalizer import Moments


def init_group(
    dev: DeviceContext, rank: int, world_size: int, address: str, port: int, timeout_s: float = 1800.0
) -> None:
    """Join the learners' process group (blocks until all `world_size` ranks have joined). A
    collective that waits `timeout_s` for its peers fails instead of hanging (a peer that died or
    raised between collectives)."""
    dist.init_process_group(
        backend=dev.distributed_backend(),
        init_method=f"tcp://{address}:{port}",
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=timeout_s),
    )


def world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


class LossModule(nn.Module):
    """The module torch's DDP wraps around an env policy: its forward is the loss (`loss_fn(model,
    batch)`), so DDP's reducer, which a forward through the wrapper arms, hears every update
    (the algorithms compute their losses from the policy's own methods, not its `forward`)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, loss_fn: Callable[..., Any], batch: dict[str, torch.Tensor]) -> Any:
        return loss_fn(self.model, batch)


def data_parallel(model: nn.Module) -> DistributedDataParallel:
    """`model` as a replica of the learner group (`learner.parallel: ddp`, an env policy's):
    torch's DDP over the group's process group, which averages the gradients in buckets while
    the backward pass runs. The graph is static (the same loss over the same parameters every
    update): DDP learns in the first update which parameters a loss leaves out (a head an
    algorithm does not train) and does not wait for their gradients, without searching the
    graph each time; gradient checkpointing of the policy's blocks is allowed by it too.
    Buffers are not sent each forward (the normalizers' statistics are folded in alike on every
    rank, `gather_moments`). Built after the rank joined the group; it broadcasts rank 0's
    weights and buffers once (they are equal)."""
    return DistributedDataParallel(
        LossModule(model), static_graph=True, forward_sync_buffers=False, gradient_as_bucket_view=True
    )


def mean_across_learners(value: torch.Tensor) -> torch.Tensor:
    """The mean of a scalar over all learners (every rank must take the same early-stop decision)."""
    if world_size() == 1:
        return value
    out = value.detach().clone().float()
    dist.all_reduce(out)
    return out / world_size()


def gather_moments(local: list[Moments]) -> list[Moments]:
    """Every learner's pending normalizer moments, so all replicas fold in the same statistics."""
    if world_size() == 1:
        return local
    gathered: list[list[dict] | None] = [None] * world_size()
    dist.all_gather_object(gathered, [m.to_numpy() for m in local])
    return [Moments.from_numpy(d) for part in gathered for d in (part or [])]
