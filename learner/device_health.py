"""What the learner's device says about itself, each iteration: how busy it is, its memory used and
total, its temperature and power, where the device can tell (the Ascend tutorial's advice: watch
the NPU's temperature, memory and utilization while it trains).

A registry by device type: `cpu` reads psutil (the learner process's CPU time over its reserved
cores, its resident memory against the host's, the hottest CPU sensor where the kernel has one),
`cuda` reads NVML (`nvidia-ml-py`, imported lazily; the device found by its UUID, so
CUDA_VISIBLE_DEVICES never mixes up indices), `npu` reads torch_npu's `mem_get_info`, pyACL's
`acl.rt.get_device_utilization_rate` and `npu-smi info -t temp|power` (a subprocess, so at most
every `SLOW_EVERY_S`). What a device cannot tell is left out of the line, never made up.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from typing import Any

import psutil
import torch

from ..learner.device import DeviceContext, backend_module

Reading = dict[str, float]
SLOW_EVERY_S = 5.0  # npu-smi is a process start: not every iteration


class CpuProbe:
    """The learner process on the CPU: its RSS, the host's memory, the hottest sensor. No
    utilization: torch's intra-op threads keep every core they may busy (spinning included), so
    the process's CPU share read 1.00 whatever the learner did; learner_busy is the CPU's figure."""

    def __init__(self, dev: DeviceContext, cores: float) -> None:
        self.proc = psutil.Process()

    def sample(self) -> Reading:
        out = {
            "device_memory_used_bytes": float(self.proc.memory_info().rss),
            "device_memory_total_bytes": float(psutil.virtual_memory().total),
        }
        temps: dict[str, list[Any]] = getattr(psutil, "sensors_temperatures", dict)()
        current = [t.current for entries in temps.values() for t in entries if t.current]
        if current:
            out["device_temperature_c"] = float(max(current))
        return out


class NvmlProbe:
    """A CUDA device through NVML (nvidia-ml-py's `pynvml`)."""

    def __init__(self, dev: DeviceContext, cores: float) -> None:
        import pynvml

        self.nvml = pynvml
        pynvml.nvmlInit()
        index = dev.device.index if dev.device.index is not None else torch.cuda.current_device()
        uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
        self.handle = (
            pynvml.nvmlDeviceGetHandleByUUID(f"GPU-{uuid}")
            if uuid is not None
            else pynvml.nvmlDeviceGetHandleByIndex(index)
        )

    def sample(self) -> Reading:
        n, h = self.nvml, self.handle
        mem = n.nvmlDeviceGetMemoryInfo(h)
        return {
            "device_utilization": n.nvmlDeviceGetUtilizationRates(h).gpu / 100.0,
            "device_memory_used_bytes": float(mem.used),
            "device_memory_total_bytes": float(mem.total),
            "device_temperature_c": float(n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU)),
            "device_power_w": n.nvmlDeviceGetPowerUsage(h) / 1000.0,  # milliwatts
        }


def smi_value(text: str, *words: str) -> float | None:
    """The number of the first `key : value` line of npu-smi output whose key holds every word
    (case-insensitive), e.g. 'NPU Temperature (C) : 45' for ("temp",)."""
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and all(w in key.lower() for w in words):
            m = re.search(r"-?\d+(\.\d+)?", value)
            if m:
                return float(m.group(0))
    return None


class NpuProbe:
    """An Ascend NPU: memory from torch_npu, AI Core use from pyACL, temperature and power from
    npu-smi (every SLOW_EVERY_S)."""

    def __init__(self, dev: DeviceContext, cores: float) -> None:
        self.npu = backend_module("npu")
        self.device = dev.device
        self.index = dev.device.index or 0
        visible = os.environ.get("ASCEND_RT_VISIBLE_DEVICES", "")
        ids = [x.strip() for x in visible.split(",") if x.strip()]
        self.physical = int(ids[self.index]) if self.index < len(ids) else self.index  # npu-smi's id
        self.smi = shutil.which("npu-smi")
        self._slow: Reading = {}
        self._slow_at = -SLOW_EVERY_S

    def _acl_utilization(self) -> float | None:
        try:
            import acl  # pyACL, on CANN hosts
        except ImportError:
            return None
        info, ret = acl.rt.get_device_utilization_rate(self.index)
        cube = next((v for k, v in (info or {}).items() if "cube" in k.lower()), None)
        return cube / 100.0 if ret == 0 and isinstance(cube, int | float) and cube >= 0 else None

    def _smi(self, kind: str) -> str:
        if self.smi is None:
            return ""
        cmd = [self.smi, "info", "-t", kind, "-i", str(self.physical), "-c", "0"]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=10, check=False)
        return done.stdout if done.returncode == 0 else ""

    def sample(self) -> Reading:
        free, total = self.npu.mem_get_info(self.device)
        out: Reading = {
            "device_memory_used_bytes": float(total - free),
            "device_memory_total_bytes": float(total),
        }
        used = self._acl_utilization()
        if used is not None:
            out["device_utilization"] = used
        now = time.monotonic()
        if now - self._slow_at >= SLOW_EVERY_S:
            self._slow_at = now
            temp, power = smi_value(self._smi("temp"), "temp"), smi_value(self._smi("power"), "power")
            self._slow = {
                k: v for k, v in (("device_temperature_c", temp), ("device_power_w", power)) if v is not None
            }
        return {**out, **self._slow}


PROBES: dict[str, Callable[[DeviceContext, float], Any]] = {
    "cpu": CpuProbe,
    "cuda": NvmlProbe,
    "npu": NpuProbe,
}


class DeviceHealth:
    """The probe for the learner's device; a probe that cannot start or read (no NVML library, no
    driver) is dropped after saying why once, and training goes on without these keys."""

    def __init__(self, dev: DeviceContext, cores: float) -> None:
        self.problem: str | None = None
        self.probe: Any = None
        make = PROBES.get(dev.type)
        if make is None:
            self.problem = f"no health probe for {dev.type} devices"
            return
        try:
            self.probe = make(dev, cores)
        except Exception as err:  # an optional library or a driver that is not there
            self.problem = f"{dev.type} health unavailable ({type(err).__name__}: {err})"[:200]

    def sample(self) -> Reading:
        if self.probe is None:
            return {}
        try:
            return self.probe.sample()
        except Exception as err:
            self.problem = f"reading {type(self.probe).__name__} failed ({type(err).__name__}: {err})"[:200]
            self.probe = None
            return {}
