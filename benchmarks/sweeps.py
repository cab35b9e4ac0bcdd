"""Sweeps and tracking, measured: what `relay sweep` finds and what it costs, and what tracking costs
training.

    python benchmarks/sweeps.py                      # every section
    python benchmarks/sweeps.py --only random        # 8-trial random CartPole sweep, FIFO then ASHA
    python benchmarks/sweeps.py --only pbt           # Pendulum: 4 trials with PBT, the same 4 without
    python benchmarks/sweeps.py --only tracking      # CartPole W=2: no tracking / MLflow / W&B offline

random: `relay sweep configs/cartpole_ppo.yaml` over learner.lr, learner.clip_ratio and
learner.epochs, 8 trials (the same 8 draws: random search is seeded by env.seed), each to a mean
return of 475 or 100k env steps; FIFO runs every trial to its stop, ASHA stops poor ones at 10, 30,
90 iterations. Reported: the sweep's wall, trials done / stopped early, the best return, and when
(seconds from the sweep's start) a trial first solved the task, a mean return of 475 (from each
trial's start in trials.jsonl plus the wall of its first line at that return).

pbt: `configs/pendulum_ppo.yaml`, 4 trials with every trial's budget the same (equal total env
steps), 4 at a time, PBT perturbing learner.lr and learner.clip_ratio every 10 iterations, against
the same 4 draws without PBT. Reported: best and median final return (each trial's last line).

tracking: the same async CartPole run (2 workers, 450k env steps) without tracking, with MLflow
(a server this script starts on 127.0.0.1, SQLite store) and with W&B offline, alternating over
`--repeats`; env steps/s of each, and its ratio to no tracking (target: >= 0.98).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parents[1]))
sys.path.insert(0, str(Path(__file__).parent))
from common import machine_header, mlflow_server, read_metrics, table

ROOT = Path(__file__).parents[1]
QUIET = ["metrics.progress=none", "metrics.tensorboard=false"]
SOLVED = 475.0  # CartPole's mean return that counts as solved (each trial stops there)


def sweep(folder: Path, config: str, params: list[str], flags: list[str], sets: list[str]) -> float:
    """Run `relay sweep`; returns its wall seconds."""
    cmd = [sys.executable, "-m", "relay_rl.services.cli", "sweep", config, "--dir", str(folder), *flags]
    for p in params:
        cmd += ["--param", p]
    for kv in [*QUIET, *sets]:
        cmd += ["--set", kv]
    t0 = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def trials(folder: Path) -> dict[str, dict[str, Any]]:
    states: dict[str, dict[str, Any]] = {}
    for line in (folder / "trials.jsonl").read_text().splitlines():
        rec = json.loads(line)
        state = states.setdefault(rec["trial"], {})
        if rec["event"] == "started" and "start" not in state:
            state["start"] = rec["t"]
        state.update({k: v for k, v in rec.items() if k in ("status", "params")})
    for name, state in states.items():
        state["lines"] = read_metrics(folder / name)
    return states


def first_reached(folder: Path, target: float, began: float) -> float | None:
    """Seconds from `began` (epoch) until a trial's mean return first reached `target`."""
    times = []
    for state in trials(folder).values():
        hit = next((x for x in state["lines"] if (x.get("episode_return_mean") or -1e9) >= target), None)
        if hit is not None and "start" in state:
            times.append(state["start"] + hit["wall_s"] - began)
    return min(times) if times else None


def section_random(tmp: Path) -> str:
    params = [
        "learner.lr=loguniform(1e-4,3e-3)",
        "learner.clip_ratio=choice(0.1,0.2,0.3)",
        "learner.epochs=randint(3,10)",
    ]
    sets = ["stop.env_steps=100000", f"stop.episode_return_mean={SOLVED}"]
    rows = []
    for scheduler in ("fifo", "asha"):
        folder = tmp / f"random-{scheduler}"
        began = time.time()
        wall = sweep(
            folder, "configs/cartpole_ppo.yaml", params, ["--samples", "8", "--scheduler", scheduler], sets
        )
        states = trials(folder)
        finals = [
            max((x.get("episode_return_mean") or -1e9) for x in s["lines"])
            for s in states.values()
            if s["lines"]
        ]
        best = max(finals)
        statuses = [s.get("status") for s in states.values()]
        reached = first_reached(folder, SOLVED, began)
        rows.append([
            scheduler, f"{wall:.0f}", statuses.count("done"), statuses.count("stopped early"),
            f"{best:.1f}", "n/a" if reached is None else f"{reached:.0f}",
            sum(s["lines"][-1]["env_steps"] for s in states.values() if s["lines"]),
        ])  # fmt: skip
    head = [
        "scheduler",
        "sweep wall s",
        "done",
        "stopped early",
        "best return",
        f"s to {SOLVED:.0f}",
        "env steps",
    ]
    return table(head, rows)


def section_pbt(tmp: Path) -> str:
    params = ["learner.lr=loguniform(1e-4,3e-3)", "learner.clip_ratio=uniform(0.1,0.3)"]
    sets = [
        "stop.env_steps=120000",
        "stop.episode_return_mean=null",
        "rollout.num_workers=1",
        "sweep.perturbation_interval=10",
    ]
    rows = []
    for scheduler in ("fifo", "pbt"):
        folder = tmp / f"pbt-{scheduler}"
        flags = ["--samples", "4", "--max-concurrent", "4", "--scheduler", scheduler]
        wall = sweep(folder, "configs/pendulum_ppo.yaml", params, flags, sets)
        states = trials(folder)
        finals = [s["lines"][-1]["episode_return_mean"] for s in states.values() if s["lines"]]
        exploits = sum(s["lines"][-1].get("pbt_exploits", 0) for s in states.values() if s["lines"])
        steps = sum(s["lines"][-1]["env_steps"] for s in states.values() if s["lines"])
        rows.append(
            [
                scheduler,
                f"{wall:.0f}",
                f"{max(finals):.1f}",
                f"{statistics.median(finals):.1f}",
                exploits,
                steps,
            ]
        )
    return table(
        ["scheduler", "sweep wall s", "best final return", "median final return", "exploits", "env steps"],
        rows,
    )


def _train_rate(run: Path, sets: list[str]) -> float:
    cmd = [
        sys.executable,
        "-m",
        "relay_rl.services.train",
        "configs/cartpole_ppo.yaml",
        "--run-dir",
        str(run),
    ]
    for kv in [*QUIET, "rollout.mode=async", "stop.env_steps=450000", "stop.episode_return_mean=null", *sets]:
        cmd += ["--set", kv]
    subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return float(read_metrics(run)[-1]["env_steps_per_s"])


def section_tracking(tmp: Path, repeats: int) -> str:
    store = tmp / "mlflow"
    store.mkdir()
    with mlflow_server(store) as url:
        arms = {
            "none": [],
            "mlflow": [f"metrics.mlflow.tracking_uri={url}"],
            "wandb offline": ["metrics.wandb.mode=offline"],
        }
        rates: dict[str, list[float]] = {k: [] for k in arms}
        for i in range(repeats):
            for name, sets in arms.items():
                rates[name].append(_train_rate(tmp / f"track-{i}-{name.replace(' ', '-')}", sets))
    base = statistics.median(rates["none"])
    rows = [
        [
            k,
            f"{statistics.median(v):,.0f}",
            f"{statistics.median(v) / base:.3f}",
            " ".join(f"{x:,.0f}" for x in v),
        ]
        for k, v in rates.items()
    ]
    return table(["tracking", "env steps/s (median)", "ratio to none", "each run"], rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=["random", "pbt", "tracking"])
    parser.add_argument("--repeats", type=int, default=3, help="tracking: alternating rounds")
    args = parser.parse_args()
    if args.repeats < 1:
        print("sweeps.py: --repeats must be at least 1", file=sys.stderr)
        raise SystemExit(2)
    print(machine_header("relay sweep and tracking"))
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        if args.only in (None, "random"):
            print(
                "\n## random search, FIFO and ASHA (CartPole, 8 trials)\n" + section_random(tmp), flush=True
            )
        if args.only in (None, "pbt"):
            print("\n## PBT against the same 4 trials without it (Pendulum)\n" + section_pbt(tmp), flush=True)
        if args.only in (None, "tracking"):
            print(
                "\n## tracking's cost on training (async CartPole, W=2)\n"
                + section_tracking(tmp, args.repeats)
            )


if __name__ == "__main__":
    main()
