"""The one place that knows the device: npu (torch_npu), cuda or cpu.

Resolves a device spec, owns autocast, the fp16 GradScaler, synchronize and memory statistics.
No other module spells a device type. torch_npu is imported lazily: a CPU host never touches it.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch
import torch._dynamo
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

from ..policy.compiling import torch_backend

AMP_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}

# Ray exports the ids it assigned through these variables, so inside the actor the
# first visible device is always ordinal 0 whatever its physical id.
_VISIBLE_DEVICES_ENV = {"npu": "ASCEND_RT_VISIBLE_DEVICES", "cuda": "CUDA_VISIBLE_DEVICES"}
_RAY_RESOURCE = {"npu": "NPU", "cuda": "GPU"}


class DeviceError(RuntimeError):
    """The requested device cannot be used here."""


def import_torch_npu() -> ModuleType | None:
    """torch_npu if it is importable, else None (never raises on a host without it)."""
    try:
        return importlib.import_module("torch_npu")
    except ImportError:
        return None


def _npu_available() -> bool:
    mod = import_torch_npu()
    return bool(mod is not None and mod.npu.is_available())


def backend_module(device_type: str) -> Any:
    """The per-device runtime module (torch.cuda or torch_npu.npu); None for cpu."""
    if device_type == "cuda":
        return torch.cuda
    if device_type == "npu":
        mod = import_torch_npu()
        if mod is None:
            raise DeviceError(
                "device npu requested but torch_npu is not installed (pip install relay-rl[npu])"
            )
        return mod.npu
    return None


def ray_accelerator_ids(device_type: str) -> list[str]:
    """The accelerator ids Ray assigned to the calling actor ([] outside Ray or for cpu)."""
    resource = _RAY_RESOURCE.get(device_type)
    if resource is None:
        return []
    try:
        import ray

        if not ray.is_initialized():
            return []
        return [str(i) for i in ray.get_runtime_context().get_accelerator_ids().get(resource, [])]
    except Exception:
        return []


# /proc/cpuinfo flags of CPUs that compute bf16 in hardware: AVX512-BF16 (AMD Zen 4, Intel Cooper
# Lake / Sapphire Rapids), AMX-BF16 (Intel Sapphire Rapids), Armv8.6's BF16 (Graviton3, Neoverse).
# Without them torch emulates bf16 and autocast is slower than float32 (measured: docs/benchmarks.md,
# "Speed: compiled updates, pixel precision").
CPU_BF16_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")


def cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> set[str]:
    """The CPU's feature flags (x86 `flags`, Arm `Features`); empty where the file is absent."""
    try:
        with open(cpuinfo, encoding="ascii", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    return set(value.split())
    except OSError:
        pass
    return set()


def _pick_auto() -> str:
    if _npu_available():
        return "npu"
    if torch.cuda.is_available():
        return "cuda"
    return "cpu"


def parse_device_spec(spec: str) -> tuple[str, int | None]:
    kind, _, index = spec.strip().lower().partition(":")
    if kind not in ("auto", "cpu", "cuda", "npu"):
        raise DeviceError(f"learner.device={spec!r}: expected auto, cpu, cuda[:i] or npu[:i]")
    if index and not index.isdigit():
        raise DeviceError(f"learner.device={spec!r}: device index must be a whole number")
    return kind, int(index) if index else None


def _ordinal(kind: str, index: int | None, allowed_ids: list[int]) -> int:
    """Local ordinal inside this process, honouring Ray's assignment and npu_ids."""
    assigned = ray_accelerator_ids(kind)
    if index is not None:
        return index
    if assigned:
        # Ray narrowed the visible devices to `assigned`; ordinal 0 is the first of them.
        return 0
    if allowed_ids:
        visible = os.environ.get(_VISIBLE_DEVICES_ENV[kind], "")
        ids = [int(v) for v in visible.split(",") if v.strip().isdigit()]
        return ids.index(allowed_ids[0]) if allowed_ids[0] in ids else allowed_ids[0]
    return 0


def check_device(spec: str = "auto", allowed_ids: list[int] | None = None) -> torch.device:
    """The device `spec` names on this host, checked (available, index in range); DeviceError in one
    line otherwise. Initializes nothing on the device."""
    kind, index = parse_device_spec(spec)
    if kind == "auto":
        kind = _pick_auto()
    if kind == "cpu":
        return torch.device("cpu")
    backend = backend_module(kind)
    if not backend.is_available():
        raise DeviceError(f"learner.device={spec!r}: no {kind} device is available on this host")
    ordinal = _ordinal(kind, index, allowed_ids or [])
    count = backend.device_count()
    if ordinal >= count:
        raise DeviceError(f"learner.device={spec!r}: {kind}:{ordinal} requested but {count} visible")
    return torch.device(f"{kind}:{ordinal}")


def resolve_device(spec: str = "auto", allowed_ids: list[int] | None = None) -> DeviceContext:
    """Turn `auto`, `cpu`, `cuda[:i]`, `npu[:i]` into a DeviceContext, checking availability."""
    device = check_device(spec, allowed_ids)
    if device.type == "cpu":
        return DeviceContext(device)
    backend_module(device.type).set_device(device.index)
    return DeviceContext(device, ray_ids=tuple(ray_accelerator_ids(device.type)))


@dataclass(frozen=True)
class DeviceContext:
    """A resolved device with its autocast, scaler, sync and memory-stat operations."""

    device: torch.device
    ray_ids: tuple[str, ...] = ()

    @property
    def type(self) -> str:
        return self.device.type

    @property
    def is_accelerator(self) -> bool:
        return self.device.type != "cpu"

    def __str__(self) -> str:
        return str(self.device)

    def autocast(self, enabled: bool, dtype: str = "bfloat16") -> contextlib.AbstractContextManager[Any]:
        """Autocast for this device type (bf16 or fp16); a no-op context when disabled."""
        if not enabled:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=AMP_DTYPES[dtype])

    def bf16_units(self) -> str | None:
        """What computes bf16 in hardware on this device (a CPU flag, a CUDA compute capability,
        the NPU), or None where bf16 is only emulated. CUDA: capability 8.0 (Ampere) on, since
        `torch.cuda.is_bf16_supported()` also answers yes for emulation."""
        if self.type == "cpu":
            return next((f for f in CPU_BF16_FLAGS if f in cpu_flags()), None)
        if self.type == "cuda":
            major, minor = torch.cuda.get_device_capability(self.device)
            return f"compute capability {major}.{minor}" if major >= 8 else None
        return "npu" if backend_module("npu").is_bf16_supported() else None

    def grad_scaler(self, enabled: bool, dtype: str = "bfloat16", sharded: bool = False) -> Any | None:
        """A GradScaler for fp16 on an accelerator; None where none is needed (bf16, fp32, cpu).
        `sharded` (an FSDP2 learner): the sharded scaler, whose non-finite check is all-reduced
        over the group, so every rank skips the same steps (each rank sees only its shards'
        gradients: a plain scaler's skip would be a rank's own, and the shards would part)."""
        if not (enabled and dtype == "float16" and self.is_accelerator):
            return None
        if self.type == "npu":
            amp = backend_module("npu").amp
            return amp.sharded_grad_scaler.ShardedGradScaler() if sharded else amp.GradScaler()
        if sharded:
            return ShardedGradScaler(self.type)
        return torch.amp.GradScaler(self.type)

    def synchronize(self) -> None:
        """Wait for queued kernels; call before reading a clock or the numbers lie."""
        if self.is_accelerator:
            backend_module(self.type).synchronize(self.device)

    def memory_stats(self) -> dict[str, int]:
        """Allocated and peak device memory in bytes (0 on cpu, where torch keeps no allocator stats)."""
        if not self.is_accelerator:
            return {"allocated": 0, "peak": 0}
        backend = backend_module(self.type)
        return {
            "allocated": int(backend.memory_allocated(self.device)),
            "peak": int(backend.max_memory_allocated(self.device)),
        }

    def reset_peak_memory(self) -> None:
        if self.is_accelerator:
            backend_module(self.type).reset_peak_memory_stats(self.device)

    def adam(
        self, params: Iterable[torch.nn.Parameter], lr: float, eps: float, fused: bool = True
    ) -> torch.optim.Adam:
        """Adam with fused kernels on cpu/cuda (one launch per step), foreach on npu or where
        `fused` is False."""
        if self.type == "npu" or not fused:
            return torch.optim.Adam(params, lr=lr, eps=eps, foreach=True)
        return torch.optim.Adam(params, lr=lr, eps=eps, fused=True)

    def compile_backend(self, name: str = "auto") -> Any:
        """The torch.compile backend for `learner.compile_backend`: auto is torchair's NPU graph
        backend on npu (imported only there) and inductor on cpu/cuda; inductor, aot_eager and
        eager name torch's own (aot_eager and eager compile nothing: they trace, guard and count,
        which is what a recompile check needs and costs seconds, not minutes)."""
        if name == "auto" and self.type == "npu":
            try:
                torchair = importlib.import_module("torchair")
                compiler_config = importlib.import_module("torchair.configs.compiler_config")
            except ImportError as err:
                raise DeviceError(
                    "learner.compile on npu needs torchair (shipped with torch_npu); "
                    "set learner.compile_backend=aot_eager to trace without it"
                ) from err
            return torchair.get_npu_backend(compiler_config=compiler_config.CompilerConfig())
        return torch_backend(name)

    def distributed_backend(self) -> str:
        """torch.distributed backend of the learner group: gloo on cpu; on an accelerator its own
        collectives for device tensors and gloo beside them for CPU ones (object collectives, a
        sharded learner's state gathered to the CPU), as verl and OpenRLHF join their ranks."""
        return {"npu": "cpu:gloo,npu:hccl", "cuda": "cpu:gloo,cuda:nccl"}.get(self.type, "gloo")

    @contextlib.contextmanager
    def timed(self, out: dict[str, float], key: str) -> Iterator[None]:
        """Add the wall seconds of the block to out[key], synchronizing at both ends."""
        self.synchronize()
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.synchronize()
            out[key] = out.get(key, 0.0) + time.perf_counter() - t0


def accelerator_resources(
    device_spec: str, cluster_resources: dict[str, float] | None = None
) -> dict[str, float]:
    """The Ray resource the learner's device asks for ({"NPU": 1}, {"GPU": 1} or none for cpu);
    `auto` asks for what the cluster has.

    The config asks Ray for resources, never for hosts: Ray (and its autoscaler) places the actor.
    """
    kind, _ = parse_device_spec(device_spec)
    if kind == "auto":
        have = cluster_resources or {}
        kind = "npu" if have.get("NPU", 0) >= 1 else "cuda" if have.get("GPU", 0) >= 1 else "cpu"
    resource = _RAY_RESOURCE.get(kind)
    return {resource: 1.0} if resource else {}


def ray_options(resources: dict[str, float]) -> dict[str, Any]:
    """Actor options for a flat resource demand ({"CPU": 1, "GPU": 1, "NPU": 1, ...})."""
    rest = {k: v for k, v in resources.items() if k not in ("CPU", "GPU")}
    options: dict[str, Any] = {"num_cpus": resources.get("CPU", 0.0)}
    if "GPU" in resources:
        options["num_gpus"] = resources["GPU"]
    if rest:
        options["resources"] = rest
    return options
