"""What `benchmarks/device_check.sh` prints after the device tests: the numbers an accelerator's
few minutes should bring back, each section skipped with its reason where this host lacks a part.

    python benchmarks/device_report.py [--device auto] [--quick]

1. the learner alone on the device, CartPole / Hopper / Breakout, eager and compiled (samples/s,
   compile seconds, compiles), with its device memory after warm-up and after the timed updates
   (the ring buffer is preallocated: the two must match);
2. Breakout end to end on Ray, a rollout worker per core (EnvPool where it imports, else ale-py), the
   learner on the device and then on this host's CPU: env steps/s, learner_busy and the device's
   utilization, and the ratio (needs Ray: the fleet pieces of benchmarks/device_wheels.sh);
3. `relay verify` of a fresh CartPole checkpoint on the device (the precision table's device column);
4. serving latency on the device: the policy service's answer to 1 and 32 rows, p50 over 200 calls;
5. a short soak: the CartPole learner alone for `--soak-s` seconds of rounds, its device memory
   allocated after every round (flat after warm-up: the ring buffer is preallocated) and the peak;
6. GRPO on a Qwen2.5-0.5B-shaped causal LM (benchmarks/device_llm.py): generation against
   transformers' `generate`, the learner with and without gradient checkpointing, `compiles`,
   and TRL's GRPOTrainer on the same model and device;
7. CartPoleNoVel in local mode, the LSTM config against the same without a core at equal env
   steps, the learner on the device and on the CPU (benchmarks/recurrent.py's measure: the LSTM
   run's wall over the memoryless one's, at most 1.3 wanted; the CPU is arithmetic-bound there).

--only N[,N...] runs only those sections.

--quick shrinks every part to seconds (the CPU path CI runs); its numbers are not measurements.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import device_llm
import recurrent
from common import failure, machine_header, table, train_relay

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


def fleet_shape(cores: int) -> tuple[int, int]:
    """(rollout workers, learner CPUs) for a host of `cores` >= 2: the learner keeps two threads
    (one where the host has under 4 cores) and every other core gets a worker of its own."""
    learner_cpus = 2 if cores >= 4 else 1
    return cores - learner_cpus, learner_cpus


def fleet_sets(device: str, cores: int, backend: str, wall_s: float) -> list[str]:
    """The shipped Breakout config on `cores` cores, learner on `device`. The round grows with the
    fleet (W x 8 envs x 128 steps, 4 minibatches of it, 4 epochs as shipped), so the learner does
    the same work per env step whatever W is, as CleanRL's batch grows with its envs."""
    workers, learner_cpus = fleet_shape(cores)
    cfg = _load("breakout_ppo", [])
    steps = workers * cfg.env.num_envs * cfg.rollout.rollout_len
    return [
        f"learner.device={device}",
        f"learner.num_cpus={learner_cpus}",
        f"rollout.num_workers={workers}",
        "rollout.num_cpus_per_worker=1",
        f"env.vectorization={backend}",
        f"learner.buffer_size={steps}",
        f"learner.batch_size={steps // 4}",
        "stop.env_steps=100000000",
        f"stop.wall_s={wall_s:g}",
    ]


def _median_of_second_half(lines: list[dict[str, Any]], key: str) -> float | None:
    tail = [x[key] for x in lines[len(lines) // 2 :] if x.get(key) is not None]
    return statistics.median(tail) if tail else None


def breakout_end_to_end(device: str, quick: bool, wall_s: float) -> str:
    """Breakout on Ray with a worker per core, the learner on `device` and then on this host's
    CPU, one after the other: env steps/s, learner_busy and the device's utilization (NVML, pyACL)
    over each run's second half, and the device's speed-up over the CPU learner."""
    if quick:
        return "skipped: --quick (Breakout with a rollout worker per core is minutes of a run)"
    why = _missing("ray", "envpool") and _missing("ray", "ale_py")
    if why:
        return why
    backend = "envpool" if importlib.util.find_spec("envpool") else "sync"
    cores = os.cpu_count() or 1
    if cores < 2:
        return "skipped: one core (a learner and a rollout worker need a core each)"
    workers, learner_cpus = fleet_shape(cores)
    rows, speed = [], {}
    for learner in dict.fromkeys([device, "cpu"]):
        try:
            lines = train_relay("configs/breakout_ppo.yaml", fleet_sets(learner, cores, backend, wall_s))
        except Exception as err:  # one failed run is a row: the other's numbers are still worth having
            rows.append([learner, workers, learner_cpus, backend, 0, failure(err), "", ""])
            continue
        sps = _median_of_second_half(lines, "env_steps_per_s")
        busy = _median_of_second_half(lines, "learner_busy")
        util = _median_of_second_half(lines, "device_utilization")
        speed[learner] = sps or 0.0
        rows.append(
            [
                learner,
                workers,
                learner_cpus,
                backend,
                len(lines),
                f"{sps:,.0f}" if sps is not None else "no lines",
                f"{busy:.2f}" if busy is not None else "",
                f"{util:.2f}" if util is not None else "n/a",
            ]
        )
    head = ["learner", "W", "learner CPUs", "vectorization", "lines", "env steps/s", "learner_busy"]
    head.append("device util")
    out = [table(head, rows), f"({cores} cores, {wall_s:g} s a run, medians over each run's second half)"]
    if device != "cpu" and speed.get(device) and speed.get("cpu"):
        out.append(f"learner on {device} / on cpu: {speed[device] / speed['cpu']:.2f}x env steps/s")
    return "\n".join(out)


def recurrent_wall(device: str, quick: bool) -> str:
    """CartPoleNoVel to the same env steps with the LSTM core and without, learner on `device`
    and then on the CPU (in-process rollouts, one after another): the walls and their ratios."""
    env_steps = 512 if quick else 49_152
    rows, ratios = [], []
    for learner in dict.fromkeys([device, "cpu"]):
        try:
            walls, ratio = recurrent.lstm_against_no_core(env_steps, [f"learner.device={learner}"])
        except Exception as err:  # as in section 2: the other learner's pair still counts
            rows.append([learner, "LSTM 64 and no core", failure(err), ""])
            continue
        rows += [[learner, name, steps, f"{wall:.1f}"] for name, (steps, wall) in walls.items()]
        ratios.append(f"learner on {learner}: LSTM / no core wall {ratio:.2f}")
    return "\n".join([table(["learner", "run", "env steps", "wall s"], rows), *ratios])


def _checkpoint(device: str, tmp: Path) -> Path:
    """A CartPole learner trained for 8 rounds on the device, checkpointed as the training loop
    does (in-process: no Ray needed)."""
    from relay_rl.contracts.checkpoint import RunCounters
    from relay_rl.learner.algorithms import algorithm_traits
    from relay_rl.learner.learner import Learner
    from relay_rl.rollout_workers.sampler import make_sampler
    from relay_rl.services.runs.checkpoints import write_learner_checkpoint

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
        print(failure(err), flush=True)


def _arguments() -> tuple[argparse.Namespace, set[int]]:
    """The command line and the sections it runs; one line on stderr and exit 2 where it is off."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="auto")
    parser.add_argument("--quick", action="store_true", help="seconds, not measurements (the CPU path in CI)")
    parser.add_argument("--soak-s", type=float, default=60.0, help="section 5's length in seconds")
    parser.add_argument("--e2e-s", type=float, default=90.0, help="section 2's seconds a run (two runs)")
    parser.add_argument("--only", default="1,2,3,4,5,6,7", help="the sections to run, e.g. 6 or 1,6")
    args = parser.parse_args()
    run = _sections(args.only)
    if run is None:
        print(
            f"device_report.py: --only {args.only!r}: section numbers 1-7, comma-separated", file=sys.stderr
        )
        sys.exit(2)
    if not (args.e2e_s > 0 and args.soak_s > 0):
        says = f"--e2e-s {args.e2e_s:g} --soak-s {args.soak_s:g}: seconds > 0"
        print(f"device_report.py: {says}", file=sys.stderr)
        sys.exit(2)
    return args, run


def main() -> None:
    args, run = _arguments()
    from relay_rl.learner.device import check_device

    device = str(check_device(args.device))
    print(machine_header(f"relay device report: {device}{' (--quick)' if args.quick else ''}"))
    if 1 in run:
        _section("1. The learner alone on the device", lambda: learner_alone(device, args.quick))
    if 2 in run:
        e2e = lambda: breakout_end_to_end(device, args.quick, args.e2e_s)  # noqa: E731
        _section("2. Breakout end to end, a rollout worker per core", e2e)
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
    if 7 in run:
        _section(
            "7. CartPoleNoVel: the LSTM's wall over no core's", lambda: recurrent_wall(device, args.quick)
        )


def _sections(text: str) -> set[int] | None:
    """`--only`'s section numbers (1 to 7), or None where it names something else."""
    try:
        got = {int(x) for x in text.split(",")}
    except ValueError:
        return None
    return got if got and got <= set(range(1, 8)) else None


if __name__ == "__main__":
    main()
