"""The learner, its ring buffer, AMP, the compiled update, `relay verify` and serving on the device
`RELAY_TEST_DEVICE` names: cpu by default (here and in CI, where these run as every other test),
cuda or npu under `benchmarks/device_check.sh` on a host that has one. Nothing is stood in for:
on the CPU they check the CPU path, on a GPU the GPU's. None needs Ray but the data-parallel
one (a lent GPU host may have no Ray: its wheel is too large to carry there).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

from relay_rl.contracts.checkpoint import RunCounters
from relay_rl.contracts.config import build_config, load_config
from relay_rl.learner.algorithms import algorithm_traits
from relay_rl.learner.device import backend_module, resolve_device
from relay_rl.learner.learner import Learner
from relay_rl.rollout_workers.sampler import make_sampler
from relay_rl.services.runs.checkpoints import write_learner_checkpoint
from relay_rl.services.serving.service import ActRequest, PolicyService
from relay_rl.services.tools.load import load_policy
from relay_rl.services.tools.verify import VerifyOptions, run_verify

DEVICE = os.environ.get("RELAY_TEST_DEVICE", "cpu")
pytestmark = pytest.mark.device
SMALL = {
    "rollout": {"num_workers": 1, "rollout_len": 16},
    "env": {"num_envs": 4},
    "learner": {"buffer_size": 128, "batch_size": 32, "epochs": 2, "device": DEVICE},
}


def _learner(*sets: str):
    cfg = build_config(SMALL, list(sets))
    sampler = make_sampler(cfg, algorithm_traits(cfg))
    return sampler, Learner(cfg, sampler.spec)


def test_the_learner_and_its_ring_buffer_live_on_the_device():
    sampler, learner = _learner()
    kind = resolve_device(DEVICE).type
    assert {p.device.type for p in learner.model.parameters()} == {kind}
    assert {t.device.type for t in learner.buffer.storage.values()} == {kind}
    segment = sampler.sample()
    metrics = learner.train_round([segment]).metrics
    assert metrics is not None and metrics["device"].startswith(kind)
    back = learner.buffer.gather(learner.buffer.latest_slots(1))
    np.testing.assert_array_equal(back["rewards"][0].cpu().numpy(), segment["rewards"])
    np.testing.assert_array_equal(back["obs"][0].cpu().numpy(), segment["obs"])
    assert {w.device.type for w in learner.weights().values()} == {"cpu"}


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_amp_updates_on_the_device(dtype):
    """fp16 gets a GradScaler on an accelerator (none on the CPU, where a non-finite gradient
    skips the step instead); bf16 never needs one. Weights stay finite over three updates."""
    sampler, learner = _learner("learner.use_amp=true", f"learner.amp_dtype={dtype}")
    scaled = dtype == "float16" and learner.dev.is_accelerator
    assert (learner.scaler is not None) == scaled
    for _ in range(3):
        out = learner.train_round([sampler.sample()])
        assert out.metrics is not None and out.metrics["precision"].startswith(dtype)
    assert all(torch.isfinite(p).all() for p in learner.model.parameters())
    if scaled:
        assert learner.scaler.get_scale() > 0


def test_the_compiled_update_on_the_device_never_recompiles():
    """The device's own compiler (inductor on cuda, torchair on npu); on the CPU aot_eager traces
    (inductor on the CPU is tests/learner/test_compile.py's)."""
    backend = "aot_eager" if DEVICE == "cpu" else "auto"
    sampler, learner = _learner("learner.compile=true", f"learner.compile_backend={backend}")
    counts = [learner.train_round([sampler.sample()]).metrics["compiles"] for _ in range(3)]
    assert counts[0] >= 1 and counts == [counts[0]] * 3


def test_the_compiled_pixel_update_under_autocast_never_recompiles():
    """Breakout's Nature CNN, under the precision the learner picks for pixels on this device
    (bf16 autocast + channels_last where bf16 is supported): one set of graphs, no graph break.
    On an H200 with torch 2.11 the CNN's autocast query broke the graph and its resumed frame
    compiled 6 times; CartPole's MLP (above) does not reach that code."""
    pytest.importorskip("ale_py", reason="Breakout's frames come from ale-py")
    backend = "aot_eager" if DEVICE == "cpu" else "auto"
    small = ["rollout.num_workers=0", "env.num_envs=2", "rollout.rollout_len=16", "learner.buffer_size=32"]
    sets = [*small, "learner.batch_size=16", f"learner.device={DEVICE}", "learner.compile=true"]
    config = Path(__file__).parents[2] / "configs" / "breakout_ppo.yaml"
    cfg = load_config(config, [*sets, f"learner.compile_backend={backend}"])
    sampler = make_sampler(cfg, algorithm_traits(cfg))
    learner = Learner(cfg, sampler.spec)
    segments = [sampler.sample() for _ in range(cfg.segments_per_update)]
    lines = [learner.train_round(segments).metrics for _ in range(3)]
    assert [line["compiles"] for line in lines] == [lines[0]["compiles"]] * 3
    assert [line["graph_breaks"] for line in lines] == [0, 0, 0]
    print(f"pixel learner on {DEVICE}: {lines[0]['precision']}, {lines[0]['compiles']} graphs")


def test_the_learner_reports_what_its_device_says_about_itself():
    """The health keys of an update line, read from the real device: psutil on the CPU, NVML on
    a CUDA GPU (temperature and power too), torch_npu/pyACL/npu-smi on an NPU (those three are
    stood in for in tests/learner/test_device_health.py; this is the real reading)."""
    sampler, learner = _learner()
    metrics = learner.train_round([sampler.sample()]).metrics
    assert metrics is not None and learner.telemetry.health.problem is None, learner.telemetry.health.problem
    if resolve_device(DEVICE).type == "cpu":  # no utilization on the CPU: learner_busy says it
        assert "device_utilization" not in metrics
    else:
        assert 0.0 <= metrics["device_utilization"] <= 1.0
    assert 0 < metrics["device_memory_used_bytes"] < metrics["device_memory_total_bytes"]
    if resolve_device(DEVICE).type == "cuda":
        assert 0 < metrics["device_temperature_c"] < 120 and metrics["device_power_w"] > 0
    keys = ("utilization", "memory_used_bytes", "memory_total_bytes", "temperature_c", "power_w")
    health = {k: metrics[f"device_{k}"] for k in keys if f"device_{k}" in metrics}
    print(f"device health on {DEVICE}: {health}")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A checkpoint of a learner trained on the device, written as the training loop writes one
    (in-process: a GPU host without Ray runs these tests too)."""
    sampler, learner = _learner()
    for _ in range(4):
        learner.train_round([sampler.sample()])
    folder = tmp_path_factory.mktemp("device") / "checkpoints"
    counters = RunCounters(iteration=4, env_steps=4 * learner.cfg.segment_steps)
    return write_learner_checkpoint(folder, learner.cfg, sampler.spec, learner.state_dict(), counters)


def test_relay_verify_on_the_device(trained):
    text, passed = run_verify(load_policy(str(trained)), VerifyOptions(["float32", "bfloat16"], DEVICE))
    assert passed and f"device={resolve_device(DEVICE)}" in text and "bfloat16" in text


def test_serving_on_the_device_answers_as_the_cpu_does(trained):
    on_device = PolicyService(str(trained), runtime="torch", device=DEVICE)
    on_cpu = PolicyService(str(trained), runtime="torch", device="cpu")
    assert on_device.metadata()["device"] == str(resolve_device(DEVICE))
    obs = np.random.default_rng(0).standard_normal((32, 4))
    request = [ActRequest(obs, deterministic=True)]
    assert on_device.act(request)[0]["actions"] == on_cpu.act(request)[0]["actions"]


def _devices() -> int:
    kind = resolve_device(DEVICE).type
    return 0 if kind == "cpu" else int(backend_module(kind).device_count())


@pytest.mark.skipif(
    DEVICE == "cpu" or _devices() < 2,
    reason="two accelerators (data-parallel CPU learners: tests/integration/test_data_parallel.py)",
)
def test_data_parallel_learners_on_two_devices(tmp_path):
    """Two learner actors, one device each, gradients averaged over NCCL/HCCL, on a local Ray."""
    pytest.importorskip("ray", reason="data-parallel learners are Ray actors")
    from tests.helpers import train_in_process

    run = tmp_path / "run"
    sets = ["learner.num_learners=2", f"learner.device={DEVICE}", "stop.env_steps=8192"]
    assert train_in_process("cartpole_ppo.yaml", run, *sets) == 0
    assert (run / "metrics.jsonl").read_text().count("\n") >= 2
