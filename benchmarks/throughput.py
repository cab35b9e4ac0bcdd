"""Env steps/s of relay vs the raw stepping ceiling and RLlib PPO, side by side in one run.

    pip install -e ".[cpu,bench]" && pip install "ray[rllib]==2.60.0"    # a venv of its own (gymnasium 1.2.2)
    python benchmarks/throughput.py [--seconds 20] [--workers 1,2] [--no-rllib]

For W rollout workers (each a SyncVectorEnv of 8 CartPole-v1 envs, one Ray actor per worker):
  ceiling   the same vector envs stepped with random actions, no policy (W actors in parallel);
  sampling  relay's RolloutWorker.sample() alone (two calls in flight per worker): policy
            inference on the CPU, segments built and shipped through the object store;
  training  relay end to end (`relay train`), sync and async modes: sampling + learner updates;
  rllib     RLlib PPO with W env runners x 8 envs and the same update (1,024 steps per worker,
            relay's epochs, minibatch size, lr, gamma, lambda), env steps per second of train().
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import ray

sys.path.insert(0, str(Path(__file__).parent))
from common import machine_header, rllib_ppo_update, sampling_rate, table, train_relay

ROOT = Path(__file__).parents[1]
sys.path.insert(0, str(ROOT))
from relay_rl.contracts.config import EnvConfig, build_config  # noqa: E402
from relay_rl.rollout_workers.vector_backends import make_vector_env  # noqa: E402

NUM_ENVS = 8


@ray.remote(num_cpus=1)
class RandomStepper:
    """The ceiling: the vector env alone, stepped with random actions."""

    def __init__(self, seed: int) -> None:
        self.env = make_vector_env(EnvConfig(id="CartPole-v1", num_envs=NUM_ENVS))
        self.env.reset(seed=seed)
        self.rng = np.random.default_rng(seed)

    def run(self, seconds: float) -> int:
        steps, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            self.env.step(self.rng.integers(0, 2, NUM_ENVS))
            steps += NUM_ENVS
        return steps


def ceiling(workers: int, seconds: float) -> float:
    actors = [RandomStepper.remote(i) for i in range(workers)]
    ray.get([a.run.remote(0.5) for a in actors])  # warm-up
    t0 = time.perf_counter()
    steps = sum(ray.get([a.run.remote(seconds) for a in actors]))
    return steps / (time.perf_counter() - t0)


def sampling(workers: int, seconds: float) -> float:
    cfg = build_config(
        {},
        [
            f"rollout.num_workers={workers}",
            "rollout.rollout_len=128",
            f"env.num_envs={NUM_ENVS}",
            f"learner.buffer_size={workers * 128 * NUM_ENVS}",
        ],
    )
    # Two calls in flight per worker, as in async mode: the worker never waits for the driver.
    return sampling_rate(cfg, workers, seconds, in_flight=2, num_cpus=1)


def training(workers: int, seconds: float, mode: str) -> float:
    lines = train_relay(
        "configs/cartpole_ppo.yaml",
        [
            # The same workload as RLlib's below: 1,024 env steps per worker per update.
            f"rollout.mode={mode}",
            f"rollout.num_workers={workers}",
            "rollout.rollout_len=128",
            f"learner.buffer_size={workers * 1024}",
            "stop.episode_return_mean=null",
            "stop.env_steps=10000000",
            f"stop.wall_s={seconds}",
        ],
    )
    return lines[-1]["env_steps_per_s"]


def rllib(workers: int, seconds: float) -> float:
    from ray.rllib.algorithms.ppo import PPOConfig

    # The same update as relay's training run (its config's), on a round the size of this fleet's.
    algo = (
        PPOConfig()
        .environment("CartPole-v1")
        .env_runners(num_env_runners=workers, num_envs_per_env_runner=NUM_ENVS)
        .training(**rllib_ppo_update("configs/cartpole_ppo.yaml", train_batch=workers * 1024))
        .debugging(seed=0)
        .build_algo()
    )
    algo.train()  # warm-up
    t0, steps0 = time.perf_counter(), None
    steps = 0
    while time.perf_counter() - t0 < seconds:
        result = algo.train()
        steps = int(result["env_runners"]["num_env_steps_sampled_lifetime"])
        steps0 = steps0 if steps0 is not None else steps - workers * 1024
    algo.stop()
    return (steps - (steps0 or 0)) / (time.perf_counter() - t0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--workers", default="1,2")
    parser.add_argument("--no-rllib", action="store_true")
    args = parser.parse_args()
    rows = []
    for w in [int(x) for x in args.workers.split(",")]:
        ray.init(address="local", num_cpus=max(3, w + 1), include_dashboard=False, log_to_driver=False)
        ceil, samp = ceiling(w, args.seconds), sampling(w, args.seconds)
        rl = None if args.no_rllib else rllib(w, args.seconds)
        ray.shutdown()
        sync, asyn = training(w, args.seconds, "sync"), training(w, args.seconds, "async")
        ratios = [f"{t / rl:.1f}x" if rl else None for t in (sync, asyn)]
        rows.append([w, ceil, samp, f"{samp / ceil:.0%}", sync, asyn, rl, *ratios])
    print(machine_header(f"throughput, CartPole-v1, {NUM_ENVS} envs per worker, env steps/s"))
    print(
        table(
            [
                "workers",
                "ceiling",
                "sampling",
                "sampling/ceiling",
                "training sync",
                "training async",
                "rllib ppo",
                "sync/rllib",
                "async/rllib",
            ],
            rows,
        )
    )


if __name__ == "__main__":
    main()
