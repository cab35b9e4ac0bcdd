"""What `benchmarks/device_check.sh` prints after the device tests: the numbers an accelerator's
few minutes should bring back, each section skipped with its reason where this host lacks a part.

    python benchmarks/device_report.py [--device auto] [--quick]

1. the learner alone on the device, CartPole / Hopper / Breakout, eager and compiled (samples/s,
   compile seconds, compiles), with its device memory after warm-up and after the timed updates
   (the ring buffer is preallocated: the two must match);
2. learner_busy end to end for Breakout with W = 8 rollout workers (needs Ray and EnvPool or ale-py);
3. `relay verify` of a fresh CartPole checkpoint on the device (the precision table's device column);
4. serving latency on the device: the policy service's answer to 1 and 32 rows, p50 over 200 calls;
5. a short soak: the CartPole learner alone for `--soak-s` seconds of rounds, its device memory
   allocated after every round (flat after warm-up: the ring buffer is preallocated) and the peak;
6. GRPO on a Qwen2.5-0.5B-shaped causal LM (benchmarks/device_llm.py): generation against
   transformers' `generate`, the learner with and without gradient checkpointing, `compiles`,
   and TRL's GRPOTrainer on the same model and device.

--only N[,N...] runs only those sections.

--quick shrinks every part to seconds (the CPU path CI runs); its numbers are not measurements.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import device_llm
from common import machine_header, table, train_relay

ROOT = Path(__file__).parents[1]
sys.path.insert(0, str(ROOT))

# config -> (the env's module, --quick's shrinking sets)
LEARNER_CONFIGS = {
    "cartpole_ppo": ("gymnasium", ["learner.buffer_size=512"]),
    "hopper_ppo": ("mujoco", ["env.num_envs=2", "rollout.rollout_len=64", "learner.buffer_size=128"]),
    "breakout_ppo": (
        "ale_py",
        ["env.num_envs=2", "rollout.rollout_len=32", "learner.buffer_size=64", "learner.batch_size=32"],
    ),
}


def _missing(*modules: str) -> str | None:
    gone = [m for m in modules if importlib.util.find_spec(m) is None]
    return f"skipped: {', '.join(gone)} not importable here" if gone else None


def _load(config: str, sets: list[str]) -> Any:
    from relay_rl.contracts.config import load_config

    return load_config(ROOT / "configs" / f"{config}.yaml", ["rollout.num_workers=0", *sets])


def _device_memory(device: str, warm: dict[str, Any], last: dict[str, Any]) -> list[str]:
    """MiB allocated on the device after the warm-up update -> after the timed ones, and the peak
    (the CPU keeps no allocator statistics: its memory is the soak benchmark's)."""
    if device == "cpu":
        return ["n/a on cpu", "n/a on cpu"]
    mib = 2**20
    return [
        f"{warm.get('device_memory_bytes', 0) / mib:.1f} -> {last.get('device_memory_bytes', 0) / mib:.1f}",
        f"{last.get('device_memory_peak_bytes', 0) / mib:.1f}",
    ]


def learner_alone(device: str, quick: bool) -> str:
    import torch

    from relay_rl.learner.algorithms import algorithm_traits
    from relay_rl.learner.learner import Learner
    from relay_rl.rollout_workers.sampler import make_sampler

    rows, notes = [], []
    updates = 1 if quick else 5
    for config, (module, small) in LEARNER_CONFIGS.items():
        why = _missing(module)
        if why:
            notes.append(f"{config}: {why}")
            continue
        base = [f"learner.device={device}", *(small if quick else [])]
        cfg = _load(config, base)
        sampler = make_sampler(cfg, algorithm_traits(cfg))
        segments = [sampler.sample() for _ in range(cfg.segments_per_update)]
        variants: dict[str, list[str]] = {"eager": []}
        if not (quick and device == "cpu"):
            variants["compiled"] = ["learner.compile=true"]
        for name, sets in variants.items():
            run_cfg = _load(config, [*base, *sets])
            torch.set_num_threads(run_cfg.learner.num_cpus)
            learner = Learner(run_cfg, sampler.spec)
            t0 = time.perf_counter()
            warm = learner.train_round(segments).metrics or {}
            warm_s = time.perf_counter() - t0
            times, last = [], warm
            for _ in range(updates):
                t0 = time.perf_counter()
                last = learner.train_round(segments).metrics or {}
                times.append(time.perf_counter() - t0)
            samples = run_cfg.learner.epochs * run_cfg.segments_per_update * run_cfg.segment_steps
            rows.append(
                [
                    config,
                    name,
                    last.get("precision"),
                    f"{samples / min(times):,.0f}",
                    f"{max(warm_s - min(times), 0.0):.1f}" if name == "compiled" else "",
                    last.get("compiles", ""),
                    *_device_memory(device, warm, last),
                ]
            )
        if quick and device == "cpu":
            notes.append(f"{config}: compiled skipped (--quick on cpu: inductor's C++ build takes minutes)")
    head = ["config", "update", "precision", "samples/s", "compile s", "compiles", "device MiB", "peak MiB"]
    return "\n".join([table(head, rows), *notes])


def breakout_end_to_end(device: str, quick: bool) -> str:
    why = _missing("ray", "envpool") and _missing("ray", "ale_py")
    if quick:
        return "skipped: --quick (Breakout with 8 rollout workers is minutes of a run)"
    if why:
        return why
    backend = "envpool" if importlib.util.find_spec("envpool") else "sync"
    sets = [
        f"learner.device={device}",
        "rollout.num_workers=8",
        "rollout.num_cpus_per_worker=1",
        f"env.vectorization={backend}",
        "stop.env_steps=100000000",
        "stop.wall_s=90",
    ]
    lines = train_relay("configs/breakout_ppo.yaml", sets)
    tail = lines[len(lines) // 2 :] or lines
    busy = statistics.median(x.get("learner_busy", 0.0) for x in tail)
    sps = statistics.median(x.get("env_steps_per_s", 0.0) for x in tail)
    head = ["W", "vectorization", "learner_busy (median, 2nd half)", "env steps/s"]
    return table(head, [[8, backend, f"{busy:.2f}", sps]])


def _checkpoint(device: str, tmp: Path) -> Path:
    """A CartPole learner trained for 8 rounds on the device, checkpointed as the training loop
    does (in-process: no Ray needed)."""
    from relay_rl.contracts.checkpoint import RunCounters
    from relay_rl.learner.algorithms import algorithm_traits
    from relay_rl.learner.learner import Learner
    from relay_rl.rollout_workers.sampler import make_sampler
    from relay_rl.services.driver.checkpoints import write_learner_checkpoint

    cfg = _load("cartpole_ppo", [f"learner.device={device}", "learner.buffer_size=512"])
    sampler = make_sampler(cfg, algorithm_traits(cfg))
    learner = Learner(cfg, sampler.spec)
    rounds = 8
    for _ in range(rounds):
        learner.train_round([sampler.sample() for _ in range(cfg.segments_per_update)])
    counters = RunCounters(iteration=rounds, env_steps=rounds * cfg.segments_per_update * cfg.segment_steps)
    return write_learner_checkpoint(
        tmp / "checkpoints", learner.cfg, sampler.spec, learner.state_dict(), counters
    )


def verify_on_device(device: str, ckpt: Path) -> str:
    from relay_rl.services.tools.load import load_policy
    from relay_rl.services.tools.verify import VerifyOptions, run_verify

    text, _ = run_verify(load_policy(ckpt), VerifyOptions(["float32", "bfloat16", "float16"], device))
    return text.rstrip()


def serving_latency(device: str, ckpt: Path, quick: bool) -> str:
    import numpy as np

    from relay_rl.services.serving.service import ActRequest, PolicyService

    calls = 20 if quick else 200
    rows = []
    for where in dict.fromkeys(["cpu", device]):
        service = PolicyService(str(ckpt), runtime="torch", device=where)
        for batch in (1, 32):
            obs = np.random.default_rng(0).standard_normal((batch, service.handle.obs_dim))
            request = [ActRequest(obs, deterministic=True)]
            service.act(request)  # warm-up
            times = []
            for _ in range(calls):
                t0 = time.perf_counter()
                service.act(request)
                times.append(time.perf_counter() - t0)
            rows.append([service.metadata()["device"], batch, f"{statistics.median(times) * 1e6:,.0f}"])
    return table(["device", "rows", "p50 us"], rows)


def device_soak(device: str, seconds: float) -> str:
    """Device memory allocated after each learner round over `seconds`: where it starts after a
    warm-up of 5 rounds, where it ends, its least-squares growth per 1,000 rounds, and the peak."""
    from relay_rl.learner.algorithms import algorithm_traits
    from relay_rl.learner.learner import Learner
    from relay_rl.rollout_workers.sampler import make_sampler

    cfg = _load("cartpole_ppo", [f"learner.device={device}"])
    sampler = make_sampler(cfg, algorithm_traits(cfg))
    learner = Learner(cfg, sampler.spec)
    segments = [sampler.sample() for _ in range(cfg.segments_per_update)]
    readings, peak, t_end = [], 0, time.monotonic() + seconds
    while time.monotonic() < t_end or len(readings) < 10:
        metrics = learner.train_round(segments).metrics or {}
        readings.append(int(metrics.get("device_memory_bytes", 0)))
        peak = max(peak, int(metrics.get("device_memory_peak_bytes", 0)))
    kept = readings[5:]
    xs = range(len(kept))
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(kept)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, kept, strict=True)) / max(
        sum((x - mean_x) ** 2 for x in xs), 1e-9
    )
    mib = 2**20
    row = [
        len(readings),
        f"{kept[0] / mib:.2f}",
        f"{kept[-1] / mib:.2f}",
        f"{slope * 1000 / mib:.3f}",
        f"{peak / mib:.1f}",
    ]
    head = ["rounds", "MiB after warm-up", "MiB at the end", "MiB per 1,000 rounds", "peak MiB"]
    note = (
        "\n(cpu: the device layer keeps no allocator statistics, so zeros; host memory: benchmarks/soak.py)"
    )
    return table(head, [row]) + (note if device == "cpu" else "")


def _section(title: str, body: Callable[[], str]) -> None:
    print(f"\n## {title}")
    try:
        print(body(), flush=True)
    except Exception as err:  # a report keeps going: the other sections are still worth having
        print(f"failed: {type(err).__name__}: {' '.join(str(err).split())[:300]}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="auto")
    parser.add_argument("--quick", action="store_true", help="seconds, not measurements (the CPU path in CI)")
    parser.add_argument("--soak-s", type=float, default=60.0, help="section 5's length in seconds")
    parser.add_argument("--only", default="1,2,3,4,5,6", help="the sections to run, e.g. 6 or 1,6")
    args = parser.parse_args()
    run = _sections(args.only)
    if run is None:
        print(
            f"device_report.py: --only {args.only!r}: section numbers 1-6, comma-separated", file=sys.stderr
        )
        sys.exit(2)
    from relay_rl.learner.device import check_device

    device = str(check_device(args.device))
    print(machine_header(f"relay device report: {device}{' (--quick)' if args.quick else ''}"))
    if 1 in run:
        _section("1. The learner alone on the device", lambda: learner_alone(device, args.quick))
    if 2 in run:
        _section("2. Breakout end to end, W = 8", lambda: breakout_end_to_end(device, args.quick))
    with tempfile.TemporaryDirectory() as tmp:
        ckpt: list[Path] = []

        def checkpoint() -> Path:
            if not ckpt:
                ckpt.append(_checkpoint(device, Path(tmp)))
            return ckpt[0]

        if 3 in run:
            _section("3. relay verify on the device", lambda: verify_on_device(device, checkpoint()))
        if 4 in run:
            latency = lambda: serving_latency(device, checkpoint(), args.quick)  # noqa: E731
            _section("4. Serving latency on the device", latency)
    soak_s = 3.0 if args.quick else args.soak_s
    if 5 in run:
        _section("5. A short soak: device memory over learner rounds", lambda: device_soak(device, soak_s))
    if 6 in run:
        _section("6. GRPO on a causal LM on the device", lambda: device_llm.report(device, args.quick))


def _sections(text: str) -> set[int] | None:
    """`--only`'s section numbers (1 to 6), or None where it names something else."""
    try:
        got = {int(x) for x in text.split(",")}
    except ValueError:
        return None
    return got if got and got <= set(range(1, 7)) else None


if __name__ == "__main__":
    main()
