"""NPU dispatch checks against a stand-in torch_npu (run by test_device.py in a fresh process).

There is no Ascend NPU on the machines the tests run on: the stand-in module records the calls the
device layer makes, so this checks the dispatch, not the hardware.
"""

import sys
import types

import torch

from relay_rl.learner import device as devmod
from relay_rl.learner.device import DeviceError, resolve_device


class FakeNpuBackend:
    """Stand-in for torch_npu.npu."""

    def __init__(self, count: int = 2) -> None:
        self.count = count
        self.calls: list[tuple] = []
        self.amp = types.SimpleNamespace(
            GradScaler=lambda: ("npu-scaler",),
            sharded_grad_scaler=types.SimpleNamespace(ShardedGradScaler=lambda: ("npu-sharded-scaler",)),
        )

    def is_available(self):
        return True

    def device_count(self):
        return self.count

    def set_device(self, i):
        self.calls.append(("set_device", i))

    def synchronize(self, d):
        self.calls.append(("synchronize", str(d)))

    def memory_allocated(self, d):
        return 123

    def max_memory_allocated(self, d):
        return 456

    def reset_peak_memory_stats(self, d):
        self.calls.append(("reset", str(d)))

    def is_bf16_supported(self):
        return True


def install_fake() -> FakeNpuBackend:
    torch.utils.rename_privateuse1_backend("npu")  # what real torch_npu does on import
    backend = FakeNpuBackend()
    module = types.ModuleType("torch_npu")
    module.npu = backend
    sys.modules["torch_npu"] = module
    return backend


def check_auto_prefers_npu(fake: FakeNpuBackend) -> None:
    dev = resolve_device("auto")
    assert str(dev) == "npu:0", dev
    assert ("set_device", 0) in fake.calls
    dev.synchronize()
    assert ("synchronize", "npu:0") in fake.calls
    assert dev.memory_stats() == {"allocated": 123, "peak": 456}
    dev.reset_peak_memory()
    assert ("reset", "npu:0") in fake.calls
    assert dev.grad_scaler(True, "float16") == ("npu-scaler",)
    assert dev.grad_scaler(True, "float16", sharded=True) == ("npu-sharded-scaler",)
    assert dev.grad_scaler(True, "bfloat16") is None
    assert dev.distributed_backend() == "cpu:gloo,npu:hccl"


def check_explicit_index_and_ids() -> None:
    import os

    assert str(resolve_device("npu:1")) == "npu:1"
    try:
        resolve_device("npu:2")
    except DeviceError as err:
        assert "2 visible" in str(err)
    else:
        raise AssertionError("npu:2 of 2 devices must fail")
    os.environ["ASCEND_RT_VISIBLE_DEVICES"] = "4,5"
    assert str(resolve_device("npu", allowed_ids=[5])) == "npu:1"
    del os.environ["ASCEND_RT_VISIBLE_DEVICES"]
    devmod.ray_accelerator_ids = lambda kind: ["6"] if kind == "npu" else []
    dev = resolve_device("npu")
    assert str(dev) == "npu:0" and dev.ray_ids == ("6",)


def check_precision_and_compile_backend() -> None:
    """bf16 units reported by torch_npu make `auto` pick bf16 autocast (no channels-last: the NPU
    keeps its own layouts); learner.compile's auto backend is torchair's, built with a config."""
    from relay_rl.contracts.config import LearnerConfig
    from relay_rl.learner.precision import resolve_precision

    dev = resolve_device("npu")
    assert dev.bf16_units() == "npu"
    assert resolve_precision(LearnerConfig(), dev, convolutional=True).name == "bfloat16"
    made = []
    torchair = types.ModuleType("torchair")
    torchair.get_npu_backend = lambda compiler_config: made.append(compiler_config) or "npu-backend"
    configs = types.ModuleType("torchair.configs.compiler_config")
    configs.CompilerConfig = lambda: "compiler-config"
    sys.modules["torchair"], sys.modules["torchair.configs.compiler_config"] = torchair, configs
    assert dev.compile_backend("auto") == "npu-backend" and made == ["compiler-config"]
    assert dev.compile_backend("aot_eager") is torch._dynamo.lookup_backend("aot_eager")


if __name__ == "__main__":
    fake = install_fake()
    check_auto_prefers_npu(fake)
    check_explicit_index_and_ids()
    check_precision_and_compile_backend()
    print("all npu dispatch checks passed")
