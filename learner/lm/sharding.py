"""A language policy sharded over the learner group with torch's FSDP2 (`learner.parallel: fsdp`).

No Ray here: the learner calls these once its rank has joined the group's process group
(`learner/rank.py`). The engine is torch's own (`fully_shard`), as verl, SkyRL and AReaL use it:
- each transformer block (the model's `_no_split_modules`, what Hugging Face names as the unit
  that must not be split) is one FSDP unit, the policy the root unit (it holds the embeddings, the
  final norm and a tied head together: tied weights must share a unit);
- the policy's entry points that do not go through `forward` (`completion_logp`, `generate`) are
  registered as FSDP forward methods, so the root unit gathers and frees its parameters for them;
- for generation the whole model is gathered once and kept (`gathered`): a decoding step then runs
  no collective, so ranks whose completions end at different steps never wait on each other;
- state crosses as full tensors on the CPU (`full_state`, `load_full_state`): a checkpoint is the
  same file at any N, and a run resumes at another N by loading it.

What makes the update the same at any N is the caller's (`learner/lm/learner.py`): every rank
computes the round's advantages and token weights over the whole round (whole groups per rank, the
weights normalized by the round's counts), takes its rows, and scales its loss by N, which FSDP's
gradient mean divides out.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard, register_fsdp_forward_method
from torch.distributed.tensor import DTensor

from ...learner.distributed import world_size

# The policy's methods that run the model without calling `forward`.
FORWARD_METHODS = ("completion_logp", "generate")


def blocks(policy: nn.Module, model: Any) -> list[nn.Module]:
    """The transformer blocks of a Hugging Face model inside `policy`: the modules of the classes
    its `_no_split_modules` names (LlamaDecoderLayer, Qwen2DecoderLayer, GPT2Block, ...)."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    found = [m for m in policy.modules() if type(m).__name__ in names]
    if not found:
        raise ValueError(
            f"learner.parallel=fsdp: {type(model).__name__} names no transformer block class "
            "(_no_split_modules) to shard by"
        )
    return found


def shard(policy: nn.Module, model: Any, device_type: str, mixed: bool) -> nn.Module:
    """`policy` sharded over the process group, in place: each block a unit, the policy the root.
    `mixed`: parameters gathered in bf16 for compute, gradients reduced in float32 (the float32
    master weights stay sharded)."""
    mesh = init_device_mesh(device_type, (world_size(),))
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if mixed else None
    kwargs: dict[str, Any] = {"mesh": mesh}
    if mp is not None:
        kwargs["mp_policy"] = mp
    for block in blocks(policy, model):
        fully_shard(block, **kwargs)
    fully_shard(policy, **kwargs)
    for name in FORWARD_METHODS:
        if hasattr(policy, name):
            register_fsdp_forward_method(policy, name)
    return policy


def materialize(module: nn.Module, device: torch.device, full: dict[str, torch.Tensor]) -> None:
    """A module sharded while empty (its parameters on the meta device), given memory on `device`
    and its shards of `full`, the whole weights rank 0 read (every other rank passes {}: rank 0
    sends each tensor in turn, each rank keeps its shard; a collective). Buffers no weights file
    holds (rotary frequencies) were computed as it was built, and are kept."""
    buffers = {name: b.detach().clone() for name, b in module.named_buffers()}
    module.to_empty(device=device)
    with torch.no_grad():
        for name, b in module.named_buffers():
            b.copy_(buffers[name])
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    # a copy: torch puts this rank's shards into the dict it is given, in place of the whole
    set_model_state_dict(module, dict(full), options=options)


def units(policy: nn.Module) -> list[Any]:
    """The FSDP units of a sharded policy (the root and its blocks)."""
    return [m for m in policy.modules() if isinstance(m, FSDPModule)]


@contextlib.contextmanager
def gathered(policy: nn.Module) -> Iterator[None]:
    """The whole model gathered on every rank for the block, then freed: forward passes inside run
    no collective (each rank decodes its own rows for as many steps as they take). A policy that
    is not sharded passes through."""
    fsdp = units(policy)
    for unit in fsdp:
        unit.unshard()
        unit.set_reshard_after_forward(False)
    try:
        yield
    finally:
        for unit in fsdp:
            unit.reshard()
            unit.set_reshard_after_forward(True)


def full_state(module: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and buffer of a sharded module, whole, on the CPU of rank 0 (a collective:
    every rank calls it; the other ranks get an empty dict). A parameter the module holds under
    several names (a tied head) is one tensor under each, as in the module's own state dict: a
    wire or a file that stores shared tensors once stores it once."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    state = cast(dict[str, torch.Tensor], get_model_state_dict(module, options=options))
    first: dict[int, str] = {}
    for name, p in module.named_parameters(remove_duplicate=False):
        if id(p) in first and name in state and first[id(p)] in state:
            state[name] = state[first[id(p)]]
        first.setdefault(id(p), name)
    return state


def load_full_state(module: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """`full_state`'s tensors into a sharded module (each rank keeps its shards; a collective)."""
    set_model_state_dict(module, cast(dict[str, Any], state), options=StateDictOptions(full_state_dict=True))


def full_optimizer_state(module: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer's state, whole, on rank 0's CPU, keyed by parameter name (a collective; the
    other ranks get an empty dict)."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_optimizer_state_dict(module, optimizer, options=options)


def load_full_optimizer_state(
    module: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]
) -> None:
    """`full_optimizer_state`'s into a sharded module's optimizer (a collective)."""
    set_optimizer_state_dict(module, optimizer, state, options=StateDictOptions(full_state_dict=True))


def local_state(
    module: nn.Module, optimizer: torch.optim.Optimizer | None = None
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """What this rank holds of a module (its DTensor shards where sharded, the whole tensors where
    not) and of its optimizer ({"state": {name: {...}}, "param_groups": [...]}, by parameter name;
    empty without one): what each rank writes of a sharded checkpoint, and the layout one is read
    into. No collective, no copy."""
    model = cast(dict[str, torch.Tensor], get_model_state_dict(module))
    optim = get_optimizer_state_dict(module, optimizer) if optimizer is not None else {}
    return model, cast(dict[str, Any], optim)


def set_local_state(
    module: nn.Module,
    model: dict[str, torch.Tensor],
    optimizer: torch.optim.Optimizer | None = None,
    optim_state: dict[str, Any] | None = None,
    param_groups: list[dict[str, Any]] | None = None,
) -> None:
    """`local_state`'s layout, filled (from shards), into the module and its optimizer."""
    set_model_state_dict(module, cast(dict[str, Any], model))
    if optimizer is not None:
        state = {"state": optim_state or {}, "param_groups": param_groups or []}
        set_optimizer_state_dict(module, optimizer, cast(Any, state))


def gather_rows(t: torch.Tensor) -> torch.Tensor:
    """Every rank's rows of `t` [b, ...], in rank order: [N * b, ...] (every rank has b rows)."""
    if world_size() == 1:
        return t
    parts = [torch.empty_like(t) for _ in range(world_size())]
    dist.all_gather(parts, t.contiguous())
    return torch.cat(parts)


def sum_across(values: dict[str, float], device: torch.device) -> dict[str, float]:
    """Each value summed over the ranks (their shares of a round's statistics), one collective."""
    if world_size() == 1 or not values:
        return values
    keys = sorted(values)
    t = torch.tensor([values[k] for k in keys], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return dict(zip(keys, t.tolist(), strict=True))


def local_bytes(module: nn.Module) -> int:
    """Parameter bytes this rank holds (its shards where sharded)."""
    total = 0
    for p in module.parameters():
        local = p.to_local() if isinstance(p, DTensor) else p
        total += local.numel() * local.element_size()
    return total


def model_bytes(module: nn.Module) -> int:
    """Parameter bytes of the whole model (every shard)."""
    return sum(p.numel() * p.element_size() for p in module.parameters())
