"""The rollout fleet, measured: V-trace under policy lag, pipeline efficiency, a wide fleet on one
object store, several object stores, and Sample Factory side by side.

    pip install -e ".[cpu,bench]" && pip install "ray[rllib]==2.60.0"    # a venv of its own (gymnasium 1.2.2)
    python benchmarks/fleet.py lag [--seeds 0,1,2] [--lags 1,2,4,8]
    python benchmarks/fleet.py pipeline [--seconds 20]
    python benchmarks/fleet.py wide [--workers 1,2,4,8,16,32,64] [--seconds 20]
    python benchmarks/fleet.py nodes [--seconds 20] [--rounds 3]
    python benchmarks/fleet.py elastic
    python benchmarks/fleet.py sample-factory [--seconds 60]   # builds its own venv (gymnasium<1, numpy<2)

Every number is measured on this machine in one run of the section; ratios are taken between
numbers of the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import psutil

sys.path.insert(0, str(Path(__file__).parents[1]))
sys.path.insert(0, str(Path(__file__).parent))
from common import machine_header, rllib_ppo_update, sampling_rate, table, train_relay

ROOT = Path(__file__).parents[1]
CARTPOLE = "configs/cartpole_ppo.yaml"


# ---- 1. V-trace under lag ------------------------------------------------------------------------
def lag(seeds: list[int], lags: list[int], budget: int) -> None:
    rows = []
    for n in lags:
        for correction in ("none", "vtrace"):
            steps = []
            for seed in seeds:
                lines = train_relay(
                    CARTPOLE,
                    [
                        "rollout.mode=async",
                        f"rollout.max_segments_in_flight={n}",
                        f"learner.off_policy_correction={correction}",
                        f"env.seed={seed}",
                        f"stop.env_steps={budget}",
                    ],
                )
                hit = next((x for x in lines if (x["episode_return_mean"] or 0) >= 475), None)
                steps.append(hit["env_steps"] if hit else None)
                print(f"... lag {n} {correction} seed {seed}: {steps[-1]}", file=sys.stderr, flush=True)
            mean_lag = np.mean([x["policy_lag_mean"] for x in lines])
            solved = [s for s in steps if s is not None]
            rows.append(
                [n, correction, f"{mean_lag:.2f}", *[s or "NO" for s in steps], f"{len(solved)}/{len(steps)}"]
            )
    print(
        machine_header(
            f"CartPole async: env steps to 475 (budget {budget:,}), by samples in flight per worker"
        )
    )
    headers = ["in flight", "correction", "mean lag", *[f"seed {s}" for s in seeds], "solved"]
    print(table(headers, rows))


# ---- shared: a relay run measured in-process -------------------------------------------------------
def _ray_processes_rss() -> int:
    total = 0
    for p in psutil.process_iter(["name", "cmdline", "memory_info"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if "ray::" in cmd or "raylet" in cmd or "gcs_server" in cmd or p.pid == os.getpid():
            total += p.info["memory_info"].rss if p.info["memory_info"] else 0
    return total


def _run_inprocess(sets: list[str], seconds: float) -> dict[str, Any]:
    """A training run in this process on the Ray already started: env steps/s, the driver's CPU
    seconds per round, the learner's phases per segment, memory of Ray's processes."""
    from relay_rl.contracts.config import load_config
    from tests.helpers import ray_loop

    cfg = load_config(
        CARTPOLE,
        [
            "metrics.progress=none",
            "metrics.tensorboard=false",
            "stop.episode_return_mean=null",
            "stop.env_steps=1000000000",
            f"stop.wall_s={seconds}",
            *sets,
        ],
    )
    loop, backend = ray_loop(cfg, Path(tempfile.mkdtemp()) / "run")
    try:
        cpu0 = time.process_time()
        loop.run_until_stop()
        driver_cpu = time.process_time() - cpu0
        rss = _ray_processes_rss()
    finally:
        backend.close()
    lines = [json.loads(x) for x in loop.run.metrics_path.read_text().splitlines()]
    segments = cfg.segments_per_update * len(lines)
    tail = lines[len(lines) // 2 :]
    return {
        "steps_per_s": lines[-1]["env_steps_per_s"],
        "driver_ms_per_round": driver_cpu / len(lines) * 1e3,
        "ingest_ms_per_segment": sum(x["ingest_s"] for x in lines) / segments * 1e3,
        "wait_ms_per_round": np.mean([x["wait_s"] for x in tail]) * 1e3,
        "publish_ms": np.mean([x["publish_s"] for x in tail]) * 1e3,
        "learner_busy": float(np.mean([x["learner_busy"] for x in tail])),
        "rss_gb": rss / 2**30,
        "lines": lines,
    }


# ---- 2. pipeline efficiency ----------------------------------------------------------------------
def _learner_alone(seconds: float, sets: list[str]) -> float:
    """Env steps/s the learner trains on when segments are always ready (sampled once, reused)."""
    import torch

    from relay_rl.contracts.config import load_config
    from relay_rl.learner.algorithms import algorithm_traits
    from relay_rl.learner.learner import Learner
    from relay_rl.rollout_workers.sampler import make_sampler

    cfg = load_config(CARTPOLE, sets)
    # The learner actor's threads (learner.num_cpus), not this process's default of every core:
    # the bound is the learner as the fleet runs it.
    threads = torch.get_num_threads()
    torch.set_num_threads(cfg.learner.num_cpus)
    sampler = make_sampler(cfg, algorithm_traits(cfg))
    learner = Learner(cfg, sampler.spec)
    segments = [sampler.sample() for _ in range(cfg.segments_per_update)]
    learner.train_round(segments)
    steps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        learner.train_round(segments)
        steps += cfg.update_steps
    rate = steps / (time.perf_counter() - t0)
    torch.set_num_threads(threads)
    return rate


def _sampling_alone(workers: int, seconds: float, sets: list[str]) -> float:
    """Env steps/s of the rollout workers alone (two samples in flight each, nobody learning)."""
    from relay_rl.contracts.config import load_config

    cfg = load_config(CARTPOLE, [f"rollout.num_workers={workers}", *sets])
    return sampling_rate(cfg, workers, seconds, in_flight=2)


PIPELINE = [
    "rollout.num_workers=1",
    "rollout.rollout_len=128",
    "learner.buffer_size=2048",
    "learner.batch_size=256",
]


def pipeline(seconds: float) -> None:
    import ray

    ray.init(address="local", num_cpus=3, include_dashboard=False, log_to_driver=False)
    try:
        learner_alone = _learner_alone(seconds, PIPELINE)
        sampling_alone = _sampling_alone(1, seconds, PIPELINE)
        rows = []
        for mode in ("sync", "async"):
            run = _run_inprocess([*PIPELINE, f"rollout.mode={mode}"], seconds)
            bound = min(learner_alone, sampling_alone)
            rows.append(
                [
                    mode,
                    learner_alone,
                    sampling_alone,
                    run["steps_per_s"],
                    f"{run['steps_per_s'] / bound:.2f}",
                    f"{run['learner_busy']:.2f}",
                ]
            )
    finally:
        ray.shutdown()
    print(
        machine_header(
            "pipeline efficiency: CartPole, 1 worker x 8 envs x 128 steps, 5 epochs of 256 per update"
        )
    )
    headers = ["mode", "learner alone", "sampling alone", "end to end", "efficiency", "learner_busy"]
    print(table(headers, rows))


# ---- 3. a wide fleet on one object store ------------------------------------------------------------
def _broadcast_ms(workers: int) -> tuple[float, float]:
    """(one ray.put of CartPole's weights, ms; the slowest of `workers` actors fetching it, ms)."""
    import ray

    from relay_rl.contracts.config import load_config
    from relay_rl.learner.learner import Learner
    from relay_rl.rollout_workers.envs import probe_env_spec

    cfg = load_config(CARTPOLE)
    weights = {k: v.numpy() for k, v in Learner(cfg, probe_env_spec(cfg.env)).weights().items()}

    @ray.remote(num_cpus=0.01)
    class Fetcher:
        def fetch(self, refs: list) -> float:
            t0 = time.perf_counter()
            ray.get(refs[0])
            return time.perf_counter() - t0

    fetchers = [Fetcher.remote() for _ in range(workers)]
    ray.get([f.fetch.remote([ray.put(0)]) for f in fetchers])
    t0 = time.perf_counter()
    ref = ray.put(weights)
    put = time.perf_counter() - t0
    slowest = max(ray.get([f.fetch.remote([ref]) for f in fetchers]))
    for f in fetchers:
        ray.kill(f)
    return put * 1e3, slowest * 1e3


def wide(workers: list[int], seconds: float) -> None:
    import ray

    rows = []
    for w in workers:
        # 3 logical CPUs (as every section) or what W workers at 0.05 and the learner ask for.
        cpus = max(3, int(np.ceil(w * 0.05 + 1)))
        ray.init(address="local", num_cpus=cpus, include_dashboard=False, log_to_driver=False)
        try:
            sets = [
                f"rollout.num_workers={w}",
                "rollout.num_cpus_per_worker=0.05",
                f"learner.buffer_size={w * 256}",
            ]
            run = _run_inprocess(sets, seconds)
            put_ms, fetch_ms = _broadcast_ms(w)
        finally:
            ray.shutdown()
        rows.append(
            [
                w,
                run["steps_per_s"],
                f"{run['learner_busy']:.2f}",
                f"{run['driver_ms_per_round'] / w:.2f}",
                f"{run['ingest_ms_per_segment']:.2f}",
                f"{put_ms:.2f}",
                f"{fetch_ms:.1f}",
                f"{run['rss_gb']:.1f}",
            ]
        )
        print(f"... W = {w}: {run['steps_per_s']:.0f} steps/s", file=sys.stderr, flush=True)
    print(
        machine_header("a wide fleet on one machine: sync CartPole, 8 envs per worker, 0.05 CPU per worker")
    )
    headers = [
        "W",
        "steps/s",
        "learner_busy",
        "driver ms/segment",
        "ingest ms/segment",
        "put ms",
        "slowest fetch ms",
        "Ray RSS GB",
    ]
    print(table(headers, rows))
    base = next(r for r in rows if r[0] == 2) if any(r[0] == 2 for r in rows) else rows[0]
    for r in rows:
        print(f"W = {r[0]}: {r[1] / base[1]:.2f}x of W = {base[0]}")


# ---- 4. several object stores ----------------------------------------------------------------------
def _on_raylets(nodes: list[tuple[int, bool]], sets: list[str], seconds: float) -> dict[str, Any]:
    """A run on a `ray.cluster_utils.Cluster` of a CPU-less head and `nodes` (CPUs, whether it
    holds the learner's resource), each raylet with its own 300 MB object store."""
    import ray
    from ray.cluster_utils import Cluster

    store = 300 * 1024 * 1024
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "object_store_memory": store})
    for cpus, learner in nodes:
        resources = {"learner": 1} if learner else {}
        cluster.add_node(num_cpus=cpus, resources=resources, object_store_memory=store)
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        return _run_inprocess([*sets, "learner.ray_resources={learner: 1}"], seconds)
    finally:
        ray.shutdown()
        cluster.shutdown()


def _one_node(sets: list[str], seconds: float) -> dict[str, Any]:
    import ray

    ray.init(address="local", num_cpus=5, include_dashboard=False, log_to_driver=False)
    try:
        return _run_inprocess(sets, seconds)
    finally:
        ray.shutdown()


def nodes(seconds: float, rounds: int) -> None:
    """One node against four raylets, the layouts alternating over `rounds` rounds so the shared
    machine's swings (+-40% between minutes here) fall on all of them; medians, and the median of
    each round's ratio to one node."""
    sets = ["rollout.num_workers=4", "learner.buffer_size=1024", "learner.device=cpu"]
    # The same four raylets twice: every actor on the learner's node (the other raylets idle, so
    # only their processes cost), then the workers on the two other nodes (segments and weights
    # cross object stores). Against one node, the first is what the extra raylets cost on these
    # shared cores, the second against the first what crossing stores costs.
    layouts: dict[str, Callable[[], dict[str, Any]]] = {
        "one node": lambda: _one_node(sets, seconds),
        "4 raylets, all on one": lambda: _on_raylets([(5, True), (0, False), (0, False)], sets, seconds),
        "4 raylets, spread": lambda: _on_raylets([(1, True), (2, False), (2, False)], sets, seconds),
    }
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in layouts}
    for _ in range(rounds):
        for name, run in layouts.items():
            runs[name].append(run())
    print(
        machine_header(
            "one object store vs four raylets: sync CartPole, W = 4, "
            f"{rounds} alternating rounds of {seconds:.0f} s"
        )
    )
    one = [r["steps_per_s"] for r in runs["one node"]]
    rows = []
    for name, rs in runs.items():
        rates = [r["steps_per_s"] for r in rs]
        rows.append(
            [
                name,
                " / ".join(f"{x:,.0f}" for x in rates),
                float(np.median(rates)),
                f"{np.median([x / o for x, o in zip(rates, one, strict=True)]):.2f}x",
                f"{np.median([r['learner_busy'] for r in rs]):.2f}",
                f"{np.median([r['wait_ms_per_round'] for r in rs]):.1f}",
                f"{np.median([r['ingest_ms_per_segment'] for r in rs]):.2f}",
                f"{np.median([r['publish_ms'] for r in rs]):.2f}",
            ]
        )
    print(
        table(
            [
                "cluster",
                "steps/s by round",
                "median",
                "/ one node",
                "learner_busy",
                "learner wait ms/round",
                "ingest ms/segment",
                "publish ms",
            ],
            rows,
        )
    )


# ---- 4. The elastic fleet over time -------------------------------------------------------------
def elastic() -> None:
    from tests.helpers import ELASTIC_CARTPOLE, ELASTIC_SATURATED, ELASTIC_STARVING

    cases = {
        "slow env, 1 -> 4 workers": [*ELASTIC_STARVING, "stop.env_steps=12000"],
        "heavy learner, 3 -> 1 workers": [*ELASTIC_SATURATED, "stop.env_steps=5000"],
    }
    for name, sets in cases.items():
        lines = train_relay(CARTPOLE, [*ELASTIC_CARTPOLE, *sets])
        step = max(1, len(lines) // 16)  # about 16 rows per table
        rows = []
        for i in range(0, len(lines), step):  # the first line alone, then windows of `step` lines
            window, line = lines[max(i - step + 1, 0) : i + 1], lines[i]
            prev = lines[i - step] if i else {"env_steps": 0, "wall_s": 0.0}
            rate = (line["env_steps"] - prev["env_steps"]) / max(line["wall_s"] - prev["wall_s"], 1e-9)
            busy = float(np.mean([x["learner_busy"] for x in window]))
            rows.append([round(line["wall_s"], 1), line["num_workers"], rate, f"{busy:.2f}"])
        print(
            machine_header(
                f"elastic fleet, CartPole async, {name}: env steps/s and learner_busy over each "
                f"{step} metrics lines"
            )
        )
        print(table(["wall s", "workers", "env steps/s", "learner_busy"], rows))
        print()


# ---- 5. Sample Factory side by side --------------------------------------------------------------------
SF_VENV = ROOT / ".venv-sample-factory"


def _sample_factory(steps: int) -> dict[str, float]:
    """Sample Factory 2.1.1 APPO on CartPole in its own venv (it pins gymnasium < 1 and numpy < 2)."""
    python = SF_VENV / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(SF_VENV)], check=True)
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", "torch==2.13.0", "sample-factory==2.1.1"], check=True
        )
    script = Path(__file__).with_name("sf_cartpole.py")
    out = subprocess.run([str(python), str(script), str(steps)], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _rllib_cartpole(algo: str, seconds: float) -> tuple[float | None, float | None]:
    """RLlib PPO or APPO on CartPole for `seconds`, 2 env runners x 8 envs, relay's 64x64 tanh MLP:
    (env steps/s after the first iteration, seconds from launch to a mean return of 475)."""
    import ray
    from ray.rllib.algorithms.appo import APPOConfig
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    launch = time.perf_counter()
    ray.init(address="local", num_cpus=3, include_dashboard=False, log_to_driver=False)
    try:
        config = (
            (APPOConfig if algo == "appo" else PPOConfig)()
            .environment("CartPole-v1")
            .env_runners(num_env_runners=2, num_envs_per_env_runner=8)
            .rl_module(model_config=DefaultModelConfig(fcnet_hiddens=[64, 64], fcnet_activation="tanh"))
            .debugging(seed=0)
        )
        if algo == "ppo":  # relay's CartPole update: 1,024 steps a round, 5 epochs of 256
            config = config.training(**rllib_ppo_update(CARTPOLE))
        built = config.build_algo()
        start, first, solved = time.perf_counter(), None, None
        while time.perf_counter() - start < seconds:
            runners = built.train().get("env_runners", {})
            steps = int(runners.get("num_env_steps_sampled_lifetime", 0))
            now = time.perf_counter()
            first = first or (now, steps)
            if solved is None and (runners.get("episode_return_mean") or 0) >= 475:
                solved = now - launch
        built.stop()
    except Exception as err:  # an RLlib failure is a row that says so, not a lost table
        print(f"... RLlib {algo} failed: {type(err).__name__}: {err}", file=sys.stderr)
        return None, None
    finally:
        ray.shutdown()
    rate = (steps - first[1]) / max(now - first[0], 1e-9) if now > first[0] else None
    return rate, solved


def sample_factory(seconds: float) -> None:
    rows = []
    sets = [
        "rollout.num_workers=2",
        "rollout.mode=async",
        "learner.off_policy_correction=vtrace",
        "stop.env_steps=100000000",
        f"stop.wall_s={seconds}",
        "stop.episode_return_mean=null",
    ]
    lines = train_relay(CARTPOLE, sets)
    hit = next((x for x in lines if (x["episode_return_mean"] or 0) >= 475), None)
    startup = lines[0].get("startup_s") or 0.0
    rows.append(
        ["relay async + V-trace", lines[-1]["env_steps_per_s"], hit["wall_s"] + startup if hit else None]
    )
    sf = _sample_factory(int(lines[-1]["env_steps"]))  # the same number of env steps
    rows.append(["Sample Factory APPO", sf["steps_per_s"], sf.get("seconds_to_475")])
    for algo in ("appo", "ppo"):
        rows.append([f"RLlib {algo.upper()}", *_rllib_cartpole(algo, seconds)])
    print(
        machine_header(
            f"CartPole, 2 workers x 8 envs, 64x64 tanh MLP: relay and RLlib for {seconds:.0f} s, Sample "
            f"Factory for the same {lines[-1]['env_steps']:,} env steps as relay; env steps/s (after "
            "startup) and seconds from launch to a mean return of 475"
        )
    )
    print(table(["system", "env steps/s", "s to 475"], rows))
    ratio = rows[0][1] / rows[1][1]
    print(
        f"relay / Sample Factory throughput: {ratio:.2f}x (target >= 1: {'met' if ratio >= 1 else 'missed'})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("section", choices=["lag", "pipeline", "wide", "nodes", "elastic", "sample-factory"])
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--lags", default="1,2,4,8")
    parser.add_argument("--budget", type=int, default=300_000)
    parser.add_argument("--workers", default="1,2,4,8,16,32,64")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, help="nodes: rounds the layouts alternate over (default 3)")
    args = parser.parse_args()
    if args.rounds is not None and args.section != "nodes":
        print(f"fleet.py: --rounds does not apply to {args.section} (only to nodes)", file=sys.stderr)
        sys.exit(2)
    if args.section == "lag":
        lag([int(s) for s in args.seeds.split(",")], [int(n) for n in args.lags.split(",")], args.budget)
    elif args.section == "pipeline":
        pipeline(args.seconds)
    elif args.section == "wide":
        wide([int(w) for w in args.workers.split(",")], args.seconds)
    elif args.section == "nodes":
        nodes(args.seconds, args.rounds or 3)
    elif args.section == "elastic":
        elastic()
    else:
        sample_factory(args.seconds)


if __name__ == "__main__":
    main()
