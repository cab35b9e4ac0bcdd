"""Data-parallel learners: one process group across N learner actors (HCCL on NPUs, NCCL on GPUs,
gloo on CPUs, chosen by the device layer). Each learner trains on its share of the segments;
gradients are averaged before every optimizer step, so all replicas hold identical weights.
No Ray here: the ranks call these with the rank and the address the learner group gives them.
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

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


def average_gradients(params: list[nn.Parameter]) -> None:
    """All-reduce the gradients as one flat buffer (one collective per optimizer step)."""
    if world_size() == 1:
        return
    grads = [p.grad for p in params if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= world_size()
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


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
