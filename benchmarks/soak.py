"""Soak: does every process of a long run keep its memory flat, and the run its speed?

    python benchmarks/soak.py --minutes 30                                   # async CartPole
    python benchmarks/soak.py --config configs/breakout_ppo.yaml --minutes 30 --set env.num_envs=8

Runs `relay train` (a subprocess with a RAY_TMPDIR of its own, so every Ray process of the run is
found by its command line or as a descendant of its raylet) until `--minutes` are up, sampling the
resident memory of each process every `--every` seconds: the driver, the learner, the rollout
workers, Ray's GCS and raylet, and Ray's other processes. Prints, per process kind, the memory at
the end of the warm-up and at the end, and the growth per hour of a least-squares line fitted to
the samples after the warm-up (default 5 minutes), of all resident memory and of its private part
(without shared pages: a process that writes or reads segments in Ray's object store touches more
of the store's shared pages as the store hands out new places, which counts in its resident memory
but is the store's, bounded by its size, not the process's), and the learner's and the driver's glibc
heap from the metrics lines (in use: allocated and not freed, where a leak grows; free: freed and kept by the
allocator); then env steps/s over minutes 5-10 against the
last 5 minutes, with the learner's update time (the same work every iteration: it measures the
machine) and the CPU time the hypervisor stole in each window, and the learner's device memory
(allocated, peak) from its metrics lines.
Targets: growth <= 10 MB per hour for every process kind; the last 5 minutes' throughput >= 95% of
minutes 5-10.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).parents[1]))
sys.path.insert(0, str(Path(__file__).parent))
from common import machine_header, table

ROOT = Path(__file__).parents[1]
MB = 2**20
GROWTH_TARGET_MB_H = 10.0
THROUGHPUT_TARGET = 0.95
STEAL, TOTAL = "_steal", "_total"  # machine CPU counters kept beside the memory samples
PRIVATE = " (private)"  # a kind's resident memory that is its own: not shared pages


def kind_of(proc: psutil.Process, driver: int) -> str:
    """The process kind a sample counts toward (Ray names actor processes ray::<Class>)."""
    if proc.pid == driver:
        return "driver"
    try:
        text = " ".join(proc.cmdline()) or proc.name()
    except psutil.Error:
        return "gone"
    for needle, kind in (
        ("LearnerActor", "learner"),
        ("RolloutWorker", "rollout workers"),
        ("gcs_server", "gcs_server"),
        ("raylet", "raylet"),
    ):
        if needle in text:
            return kind
    return "other Ray processes"


def run_processes(driver: psutil.Process, ray_tmp: str) -> list[psutil.Process]:
    """The driver, its descendants, and every process whose command line names the run's
    RAY_TMPDIR (the GCS and raylet), with their descendants (the workers)."""
    found = {driver.pid: driver}
    for p in psutil.process_iter(["cmdline"]):
        if ray_tmp in " ".join(p.info["cmdline"] or []):
            found[p.pid] = p
    for p in list(found.values()):
        try:
            found.update({c.pid: c for c in p.children(recursive=True)})
        except psutil.Error:
            continue
    return list(found.values())


def sample(driver: psutil.Process, ray_tmp: str) -> dict[str, float]:
    """MB of resident memory by process kind, now: all of it under the kind's name, and the
    private part (resident minus shared pages: minus the pages of Ray's object store a process has
    touched, and of mapped files) under `<kind>` + PRIVATE."""
    out: dict[str, float] = defaultdict(float)
    for p in run_processes(driver, ray_tmp):
        try:
            mem = p.memory_info()
        except psutil.Error:
            continue
        kind = kind_of(p, driver.pid)
        out[kind] += mem.rss / MB
        out[kind + PRIVATE] += (mem.rss - mem.shared) / MB
    out.pop("gone", None)
    out.pop("gone" + PRIVATE, None)
    return dict(out)


def slope_per_hour(ts: list[float], ys: list[float]) -> float:
    """Least-squares slope of ys over ts (seconds), per hour."""
    n = len(ts)
    if n < 2:
        return float("nan")
    mt, my = sum(ts) / n, sum(ys) / n
    var = sum((t - mt) ** 2 for t in ts)
    return 3600 * sum((t - mt) * (y - my) for t, y in zip(ts, ys, strict=True)) / var if var else 0.0


def cpu_steal() -> tuple[int, int]:
    """(steal, total) jiffies of the machine so far: time a shared VM's cores were taken away."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    return (fields[7] if len(fields) > 7 else 0), sum(fields)


def update_ms(lines: list[dict], start_s: float, end_s: float) -> float | None:
    """Mean seconds (as ms) of the learner's update: the same work every iteration, so its time
    measures the machine, not relay."""
    inside = [x["update_s"] for x in lines if start_s <= x["wall_s"] <= end_s and "update_s" in x]
    return 1000 * sum(inside) / len(inside) if inside else None


def steps_per_s(lines: list[dict], start_s: float, end_s: float) -> float | None:
    """Env steps per second of wall time between two points of the run (metrics lines' wall_s)."""
    inside = [x for x in lines if start_s <= x["wall_s"] <= end_s]
    if len(inside) < 2:
        return None
    first, last = inside[0], inside[-1]
    return (last["env_steps"] - first["env_steps"]) / max(last["wall_s"] - first["wall_s"], 1e-9)


def soak(
    config: str, sets: list[str], minutes: float, every: float, warmup_min: float, keep: Path | None = None
) -> str:
    """The report; with `keep`, the raw samples and the run's metrics lines written there too
    (JSON: {"samples": [[seconds, {kind: bytes}]], "lines": [...]}) to look at step by step."""
    ray_tmp = tempfile.mkdtemp(prefix="rt", dir="/tmp")
    run = Path(tempfile.mkdtemp()) / "run"
    argv = [sys.executable, "-m", "relay_rl.services.train", config, "--run-dir", str(run)]
    # A soak runs by the clock: no step budget, so no lr annealing over one either.
    budget = ["stop.env_steps=null", "stop.episode_return_mean=null", f"stop.wall_s={minutes * 60 + 120}"]
    budget.append("learner.lr_anneal=false")
    for kv in [*budget, "metrics.progress=none", "metrics.tensorboard=false", *sets]:
        argv += ["--set", kv]
    proc = subprocess.Popen(
        argv,
        cwd=ROOT,
        env={**os.environ, "RAY_TMPDIR": ray_tmp},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    driver = psutil.Process(proc.pid)
    samples: list[tuple[float, dict[str, float]]] = []
    t0 = time.monotonic()
    try:
        while time.monotonic() - t0 < minutes * 60 and proc.poll() is None:
            steal, total = cpu_steal()
            samples.append((time.monotonic() - t0, {**sample(driver, ray_tmp), STEAL: steal, TOTAL: total}))
            time.sleep(every)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=180)
    if proc.returncode not in (0, 143):
        raise SystemExit(f"the run failed ({proc.returncode}): {err[-1500:]}")
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    if keep is not None:
        keep.write_text(json.dumps({"samples": samples, "lines": lines}))
    return report(config, sets, samples, lines, warmup_min * 60, minutes)


def report(
    config: str,
    sets: list[str],
    samples: list[tuple[float, dict[str, float]]],
    lines: list[dict],
    warmup_s: float,
    minutes: float,
) -> str:
    after = [(t, s) for t, s in samples if t >= warmup_s]
    kinds = sorted({k for _, s in samples for k in s if not k.endswith(PRIVATE)} - {STEAL, TOTAL})
    rows = []
    for kind in kinds:
        ts = [t for t, s in after if kind in s]
        ys = [s[kind] for t, s in after if kind in s]
        own = [s.get(kind + PRIVATE, 0.0) for t, s in after if kind in s]
        growth, private = slope_per_hour(ts, ys), slope_per_hour(ts, own)
        rows.append(
            [
                kind,
                ys[0] if ys else None,
                ys[-1] if ys else None,
                growth,
                private,
                verdict(growth, private),
            ]
        )
    # Throughput: the learner's own clock (wall_s counts from the first env step).
    wall_end = lines[-1]["wall_s"]
    early = steps_per_s(lines, 300, 600)
    late = steps_per_s(lines, wall_end - 300, wall_end)
    ratio = late / early if early and late else None
    device = [(x["wall_s"], x.get("device_memory_bytes"), x.get("device_memory_peak_bytes")) for x in lines]
    warm = next((d for d in device if d[0] >= warmup_s), device[0])
    head = [
        machine_header(f"soak: {config} {' '.join(sets)} for {minutes:g} minutes"),
        f"# {len(samples)} samples of every process, {len(lines)} iterations, "
        f"{lines[-1]['env_steps']:,} env steps; growth fitted after minute {warmup_s / 60:g}",
    ]
    mem = table(
        ["process", "MB after warm-up", "MB at the end", "growth MB/h", "private MB/h", "<= 10 MB/h"], rows
    )
    met = "yes" if ratio is not None and ratio >= THROUGHPUT_TARGET else "NO"
    windows = [(300.0, 600.0), (wall_end - 300, wall_end)]
    speed = table(
        ["window", "env steps/s", "ratio to minutes 5-10", ">= 0.95", "update ms (fixed work)", "CPU steal"],
        [
            ["minutes 5-10", early, 1.0, "-", update_ms(lines, *windows[0]), steal_share(samples, 300, 600)],
            [
                "last 5 minutes",
                late,
                ratio,
                met,
                update_ms(lines, *windows[1]),
                steal_share(samples, *windows[1]),
            ],
        ],
    )
    dev = table(
        ["device", "allocated after warm-up", "allocated at the end", "peak at the end"],
        [[lines[-1].get("device"), warm[1], device[-1][1], device[-1][2]]],
    )
    return "\n".join([*head, "", mem, "", speed, "", dev, "", heap_table(lines, warmup_s)])


HEAP_KEYS = {
    f"{proc} heap {what}": f"{proc}_heap_{key}_bytes"
    for proc in ("learner", "driver")
    for what, key in (("in use (allocated, not freed)", "in_use"), ("free (freed, kept by glibc)", "free"))
}


def heap_table(lines: list[dict], warmup_s: float) -> str:
    """The learner's and the driver's glibc heap from the metrics lines: what each has allocated
    (a leak grows here) and what glibc keeps freed (the allocator's swing), fitted after the warm-up."""
    rows = []
    for label, key in HEAP_KEYS.items():
        points = [(x["wall_s"], x[key] / MB) for x in lines if key in x and x["wall_s"] >= warmup_s]
        if len(points) < 2:
            continue
        ys = [y for _, y in points]
        growth = slope_per_hour([t for t, _ in points], ys)
        rows.append([label, ys[0], ys[-1], min(ys), max(ys), growth])
    if not rows:
        return "(no heap readings: glibc < 2.33 or no mallinfo2)"
    return table(["glibc heap", "MB after warm-up", "MB at the end", "min", "max", "growth MB/h"], rows)


def verdict(growth: float, private: float) -> str:
    """'yes' when all resident memory stays within the target; 'private: yes' when only the
    process's own memory does (the rest is shared object-store pages); else 'NO'."""
    if growth <= GROWTH_TARGET_MB_H:
        return "yes"
    return "private: yes" if private <= GROWTH_TARGET_MB_H else "NO"


def steal_share(samples: list[tuple[float, dict[str, float]]], start_s: float, end_s: float) -> float | None:
    """Fraction of the machine's CPU time stolen (hypervisor) between two points of the soak."""
    inside = [s for t, s in samples if start_s <= t <= end_s]
    if len(inside) < 2 or inside[-1][TOTAL] == inside[0][TOTAL]:
        return None
    return (inside[-1][STEAL] - inside[0][STEAL]) / (inside[-1][TOTAL] - inside[0][TOTAL])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/cartpole_ppo.yaml")
    parser.add_argument("--set", dest="sets", action="append", default=None, metavar="KEY=VALUE")
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--every", type=float, default=30.0, help="seconds between memory samples")
    parser.add_argument("--warmup", type=float, default=5.0, help="minutes before the fit starts")
    parser.add_argument(
        "--keep", type=Path, default=None, help="write the raw samples and metrics lines here"
    )
    args = parser.parse_args()
    if args.keep is not None and args.keep.exists():
        print(f"soak.py: --keep {args.keep}: exists (never overwritten)", file=sys.stderr)
        raise SystemExit(2)
    sets = args.sets if args.sets is not None else ["rollout.mode=async"]
    print(soak(args.config, sets, args.minutes, args.every, args.warmup, args.keep))


if __name__ == "__main__":
    main()
