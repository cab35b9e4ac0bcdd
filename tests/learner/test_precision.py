"""The learner's precision and layout: `auto` picks bf16 autocast only for convolutional policies on
devices with bf16 units, channels-last kernels for convolutional policies on cpu/cuda; the
learner applies what was picked, publishes plain weights, and `relay validate` says the choice."""

from __future__ import annotations

import pytest
import torch

import relay_rl.learner.device as device_mod
from relay_rl.contracts.config import LearnerConfig, build_config
from relay_rl.learner.algorithms import algorithm_traits
from relay_rl.learner.device import DeviceContext, cpu_flags
from relay_rl.learner.learner import Learner
from relay_rl.learner.precision import resolve_precision
from relay_rl.rollout_workers.sampler import make_sampler
from relay_rl.services.cli import main

PIXELS = {
    "env": {"id": "ALE/Breakout-v5", "preprocess": "atari", "num_envs": 2},
    "rollout": {"num_workers": 1, "rollout_len": 16},
    "learner": {"buffer_size": 32, "batch_size": 16, "epochs": 1},
    "model": {"kind": "cnn", "normalize_obs": False},
}


def test_cpu_flags_reads_x86_and_arm_cpuinfo(tmp_path):
    x86 = tmp_path / "x86"
    x86.write_text("processor\t: 0\nflags\t\t: fpu avx512f avx512_bf16 sse\n\nprocessor\t: 1\nflags\t: fpu\n")
    arm = tmp_path / "arm"
    arm.write_text("processor\t: 0\nFeatures\t: fp asimd bf16 i8mm\n")
    assert "avx512_bf16" in cpu_flags(str(x86)) and "bf16" in cpu_flags(str(arm))
    assert cpu_flags(str(tmp_path / "absent")) == set()


@pytest.mark.parametrize(
    ("flags", "units"),
    [({"avx512f", "avx512_bf16"}, "avx512_bf16"), ({"amx_bf16"}, "amx_bf16"), ({"avx2"}, None)],
)
def test_bf16_units_of_a_cpu_come_from_its_flags(monkeypatch, flags, units):
    monkeypatch.setattr(device_mod, "cpu_flags", lambda: flags)
    assert DeviceContext(torch.device("cpu")).bf16_units() == units


def test_bf16_units_of_cuda_start_at_ampere(monkeypatch):
    """Stand-in for a CUDA device (none here): the capability torch would report."""
    dev = DeviceContext(torch.device("cuda:0"))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (7, 5))
    assert dev.bf16_units() is None
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (9, 0))
    assert dev.bf16_units() == "compute capability 9.0"


@pytest.mark.parametrize(
    ("device", "units", "conv", "sets", "name"),
    [
        ("cpu", "avx512_bf16", True, {}, "bfloat16+channels_last"),
        ("cpu", None, True, {}, "float32+channels_last"),
        ("cpu", "avx512_bf16", False, {}, "float32"),
        ("cuda:0", "compute capability 8.0", True, {}, "bfloat16+channels_last"),
        ("cpu", None, True, {"use_amp": True}, "bfloat16+channels_last"),
        ("cpu", "avx512_bf16", True, {"use_amp": False, "channels_last": False}, "float32"),
        ("cpu", None, False, {"use_amp": True, "amp_dtype": "float16"}, "float16"),
        ("cpu", None, False, {"channels_last": True}, "float32"),  # nothing to lay out
    ],
)
def test_auto_precision_decides_by_policy_and_bf16_units(monkeypatch, device, units, conv, sets, name):
    """Devices other than the CPU are stand-ins here (bf16_units answers as theirs would; the NPU's
    case runs in npu_dispatch_checks.py, where a stand-in torch_npu names the device type)."""
    monkeypatch.setattr(DeviceContext, "bf16_units", lambda self: units)
    precision = resolve_precision(LearnerConfig(**sets), DeviceContext(torch.device(device)), conv)
    assert precision.name == name
    applied = precision.applied(LearnerConfig(**sets))
    assert applied.use_amp in (True, False) and applied.channels_last in (True, False)


def _pixel_learner(monkeypatch, units, *sets):
    monkeypatch.setattr(DeviceContext, "bf16_units", lambda self: units)
    cfg = build_config(PIXELS, list(sets))
    sampler = make_sampler(cfg, algorithm_traits(cfg))
    return sampler, Learner(cfg, sampler.spec)


def test_a_pixel_learner_applies_its_precision_and_publishes_plain_weights(monkeypatch):
    """With bf16 units (stood in for: this CPU may have none), a CNN learner keeps channels-last
    kernels, trains under bf16 autocast, says so in its metrics, and publishes contiguous float32
    weights the workers and checkpoints read as they always did."""
    sampler, learner = _pixel_learner(monkeypatch, "avx512_bf16")
    kernel = next(p for p in learner.model.parameters() if p.dim() == 4)
    assert kernel.is_contiguous(memory_format=torch.channels_last) and not kernel.is_contiguous()
    seen = []
    original = learner.algo.loss

    def recording(model, batch):
        seen.append(torch.is_autocast_enabled("cpu"))
        return original(model, batch)

    monkeypatch.setattr(learner.algo, "loss", recording)
    metrics = learner.train_round([sampler.sample(), sampler.sample()]).metrics
    assert metrics["precision"] == "bfloat16+channels_last" and seen and all(seen)
    weights = learner.weights().values()
    assert all(w.is_contiguous() and w.dtype in (torch.float32, torch.int64) for w in weights)


def test_channels_last_updates_as_nchw_does(monkeypatch):
    """The layout changes how convolutions are computed, not what they compute."""
    sampler, nhwc = _pixel_learner(monkeypatch, None)
    _, nchw = _pixel_learner(monkeypatch, None, "learner.channels_last=false")
    assert nhwc.precision.name == "float32+channels_last" and nchw.precision.name == "float32"
    segments = [sampler.sample(), sampler.sample()]
    a, b = nhwc.train_round(segments).metrics, nchw.train_round(segments).metrics
    assert a["policy_loss"] == pytest.approx(b["policy_loss"], rel=1e-4, abs=1e-6)
    for name, weight in nchw.weights().items():
        torch.testing.assert_close(nhwc.weights()[name], weight, rtol=1e-4, atol=1e-5)


def test_validate_prints_the_precision_as_a_comment(capsys):
    assert main(["validate", "configs/breakout_ppo.yaml"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("# learner precision: float32+channels_last") or first.startswith(
        "# learner precision: bfloat16+channels_last"
    )
    assert main(["validate", "configs/cartpole_ppo.yaml", "--set", "learner.use_amp=true"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "# learner precision: bfloat16 (learner.use_amp=true)"


def test_validate_for_a_remote_learner_leaves_auto_to_its_host():
    """A learner on a cluster (an address given) is not on this machine: `auto` is its host's
    decision, and settings made explicit are told without looking up a device here (a cuda
    learner's driver may have none)."""
    from relay_rl.contracts.config import load_config
    from relay_rl.services.driver.preflight import check_env, learner_precision

    cfg = load_config("configs/breakout_ppo.yaml", [])
    env = check_env(cfg)
    assert "decided on the learner's host" in learner_precision(cfg, env, "127.0.0.1:6379")
    explicit = load_config(
        "configs/breakout_ppo.yaml",
        ["learner.device=cuda", "learner.use_amp=true", "learner.channels_last=true"],
    )
    told = learner_precision(explicit, env, "127.0.0.1:6379")
    assert told == "bfloat16+channels_last (learner.use_amp=true)"
