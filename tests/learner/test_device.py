"""Device layer: the CPU path for real; npu/cuda dispatch with stand-in modules.

There is no NPU (and no GPU) on the machines these tests run on, so `fake_torch_npu` injects a
stand-in `torch_npu` module that records calls; those tests check the dispatch only.
"""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from relay_rl.learner import device as devmod
from relay_rl.learner.device import DeviceError, accelerator_resources, ray_options, resolve_device


def test_cpu_path_for_real():
    dev = resolve_device("cpu")
    assert dev.type == "cpu" and not dev.is_accelerator
    assert dev.memory_stats() == {"allocated": 0, "peak": 0}
    assert dev.grad_scaler(True, "float16") is None  # no fp16 scaler on cpu
    with dev.autocast(True, "bfloat16"):
        y = torch.nn.Linear(4, 4)(torch.randn(2, 4))
    assert y.dtype == torch.bfloat16
    with dev.autocast(False):
        assert torch.nn.Linear(4, 4)(torch.randn(2, 4)).dtype == torch.float32
    timings: dict[str, float] = {}
    with dev.timed(timings, "x"):
        pass
    assert timings["x"] >= 0
    assert dev.distributed_backend() == "gloo"


def test_auto_is_cpu_without_accelerators(monkeypatch):
    monkeypatch.setattr(devmod, "import_torch_npu", lambda: None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto").type == "cpu"


@pytest.mark.parametrize("spec", ["tpu", "cuda:x", "npu:-1"])
def test_bad_specs_are_rejected(spec):
    with pytest.raises(DeviceError, match=r"learner\.device"):
        resolve_device(spec)


def test_npu_requested_without_torch_npu_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(devmod, "import_torch_npu", lambda: None)
    with pytest.raises(DeviceError, match="torch_npu is not installed"):
        resolve_device("npu")


def test_npu_dispatch_in_a_fresh_process():
    """NPU dispatch with a stand-in torch_npu, run in its own interpreter.

    The stand-in renames torch's PrivateUse1 backend to "npu" as real torch_npu does; that rename
    is process-global and cannot be undone, so it must not leak into the other tests.
    """
    script = Path(__file__).with_name("npu_dispatch_checks.py")
    proc = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).parents[2],
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "all npu dispatch checks passed" in proc.stdout


class _FakeBackend:
    def __init__(self, count: int = 1) -> None:
        self.count = count

    def is_available(self):
        return True

    def device_count(self):
        return self.count

    def set_device(self, i):
        pass


def test_cuda_dispatch(monkeypatch):
    monkeypatch.setattr(devmod, "import_torch_npu", lambda: None)
    fake = _FakeBackend(count=1)
    monkeypatch.setattr(devmod, "backend_module", lambda kind: fake)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    dev = resolve_device("auto")
    assert str(dev) == "cuda:0"
    assert dev.distributed_backend() == "cpu:gloo,cuda:nccl"


def test_accelerator_resources_and_ray_options():
    assert accelerator_resources("npu") == {"NPU": 1}
    assert accelerator_resources("cuda:0") == {"GPU": 1}
    assert accelerator_resources("cpu") == {}
    assert accelerator_resources("auto", {"CPU": 8, "NPU": 8}) == {"NPU": 1}
    assert accelerator_resources("auto", {"CPU": 8, "GPU": 1}) == {"GPU": 1}
    assert accelerator_resources("auto", {"CPU": 8}) == {}
    assert ray_options({"CPU": 1, "NPU": 1}) == {"num_cpus": 1, "resources": {"NPU": 1}}
    assert ray_options({"CPU": 1, "GPU": 1}) == {"num_cpus": 1, "num_gpus": 1}
    assert ray_options({"CPU": 0.5}) == {"num_cpus": 0.5}
