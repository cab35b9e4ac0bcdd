"""The learner's device health each iteration: the CPU path for real; the NVML (CUDA) and Ascend
paths against stand-ins of their real interfaces, since neither device exists on this machine
(pynvml's functions, torch_npu's mem_get_info, pyACL's get_device_utilization_rate and an npu-smi
executable printing its `key : value` lines)."""

import sys
import types

import pytest
import torch

from relay_rl.contracts.config import build_config
from relay_rl.learner import device_health
from relay_rl.learner.algorithms import algorithm_traits
from relay_rl.learner.device import DeviceContext, resolve_device
from relay_rl.learner.device_health import DeviceHealth, smi_value
from relay_rl.learner.learner import Learner
from relay_rl.rollout_workers.sampler import make_sampler


def test_cpu_reports_the_learner_process_memory_and_no_utilization():
    """A CPU learner's process share of its cores read 1.00 whatever it did (torch's threads): the
    CPU reports no device_utilization rather than a number that says nothing."""
    import psutil

    health = DeviceHealth(resolve_device("cpu"), cores=1)
    assert health.problem is None
    got = health.sample()
    assert "device_utilization" not in got
    rss = psutil.Process().memory_info().rss
    assert abs(got["device_memory_used_bytes"] - rss) < 64 * 2**20
    assert got["device_memory_total_bytes"] == psutil.virtual_memory().total
    assert "device_power_w" not in got  # the CPU path cannot tell: left out, not made up


def test_every_update_line_carries_the_device_keys():
    cfg = build_config({}, ["learner.buffer_size=1024", "rollout.rollout_len=32", "learner.batch_size=64"])
    sampler = make_sampler(cfg, algorithm_traits(cfg), 0)
    learner = Learner(cfg, sampler.spec)
    out = learner.train_round([sampler.sample()])
    for _ in range(8):  # until the buffer holds what an update trains on
        if out.metrics is not None:
            break
        out = learner.train_round([sampler.sample()])
    assert out.metrics is not None
    assert "device_utilization" not in out.metrics  # the CPU's: see the test above
    assert out.metrics["device_memory_used_bytes"] > 0


def fake_nvml(calls: list) -> types.ModuleType:
    nvml = types.ModuleType("pynvml")
    nvml.NVML_TEMPERATURE_GPU = 0
    nvml.nvmlInit = lambda: calls.append("init")
    nvml.nvmlDeviceGetHandleByUUID = lambda uuid: calls.append(("uuid", uuid)) or "handle"
    nvml.nvmlDeviceGetHandleByIndex = lambda i: calls.append(("index", i)) or "handle"
    nvml.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=87, memory=40)
    nvml.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(
        used=30 * 2**30, total=80 * 2**30, free=50 * 2**30
    )
    nvml.nvmlDeviceGetTemperature = lambda h, sensor: 71
    nvml.nvmlDeviceGetPowerUsage = lambda h: 312_500  # milliwatts
    return nvml


def test_cuda_reads_nvml_for_the_device_it_runs_on(monkeypatch):
    """Stand-ins: pynvml (no NVML library here) and torch.cuda.get_device_properties (no GPU)."""
    calls: list = []
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(calls))
    monkeypatch.setattr(
        torch.cuda, "get_device_properties", lambda i: types.SimpleNamespace(uuid="1234-abcd")
    )
    health = DeviceHealth(DeviceContext(torch.device("cuda", 1)), cores=1)
    assert health.problem is None
    got = health.sample()
    assert ("uuid", "GPU-1234-abcd") in calls  # by UUID: CUDA_VISIBLE_DEVICES cannot mix indices up
    assert got == {
        "device_utilization": 0.87,
        "device_memory_used_bytes": 30 * 2**30,
        "device_memory_total_bytes": 80 * 2**30,
        "device_temperature_c": 71.0,
        "device_power_w": 312.5,
    }


def test_without_nvml_the_run_goes_on_without_the_keys(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails as where nvidia-ml-py is missing
    health = DeviceHealth(DeviceContext(torch.device("cuda", 0)), cores=1)
    assert "cuda health unavailable" in health.problem and health.sample() == {}


SMI = """#!/bin/sh
echo "$@" >> "{log}"
case "$3" in
  temp) printf 'NPU ID              : 5\\nChip ID             : 0\\nNPU Temperature (C) : 46\\n' ;;
  power) printf 'NPU ID               : 5\\nPower Dissipation(W) : 92.4\\n' ;;
esac
"""


def test_npu_reads_torch_npu_acl_and_npu_smi(monkeypatch, tmp_path):
    """Stand-ins: torch_npu's npu module (mem_get_info), pyACL's acl.rt and an npu-smi script, in
    the shapes their documentation gives (no Ascend device here)."""
    log = tmp_path / "smi.log"
    smi = tmp_path / "npu-smi"
    smi.write_text(SMI.format(log=log))
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{__import__('os').environ['PATH']}")
    monkeypatch.setenv("ASCEND_RT_VISIBLE_DEVICES", "4,5")
    npu = types.SimpleNamespace(mem_get_info=lambda dev: (20 * 2**30, 64 * 2**30))
    monkeypatch.setattr(device_health, "backend_module", lambda kind: npu)
    acl = types.ModuleType("acl")
    acl.rt = types.SimpleNamespace(
        get_device_utilization_rate=lambda i: ({"cube_utilization": 63, "vector_utilization": 10}, 0)
    )
    monkeypatch.setitem(sys.modules, "acl", acl)
    npu_device = types.SimpleNamespace(type="npu", index=1)  # torch.device("npu") needs torch_npu
    health = DeviceHealth(DeviceContext(npu_device), cores=1)
    assert health.problem is None
    got = health.sample()
    assert got == {
        "device_memory_used_bytes": 44 * 2**30,
        "device_memory_total_bytes": 64 * 2**30,
        "device_utilization": 0.63,
        "device_temperature_c": 46.0,
        "device_power_w": 92.4,
    }
    assert log.read_text().split("\n")[:2] == ["info -t temp -i 5 -c 0", "info -t power -i 5 -c 0"]
    again = health.sample()  # within SLOW_EVERY_S: npu-smi is not run again, its values stay
    assert again["device_temperature_c"] == 46.0 and len(log.read_text().splitlines()) == 2


@pytest.mark.parametrize(
    "text, words, want",
    [
        ("NPU Temperature (C)   : 46\n", ("temp",), 46.0),
        ("Chip ID : 0\nPower Dissipation(W) : 92.4\n", ("power",), 92.4),
        ("Power Dissipation(W) : NA\n", ("power",), None),
        ("", ("temp",), None),
        ("garbage without a colon 12\n", ("garbage",), None),
    ],
)
def test_npu_smi_lines_are_read_by_key(text, words, want):
    assert smi_value(text, *words) == want
