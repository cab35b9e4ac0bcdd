"""Time to solve, side by side in one run: relay vs RLlib PPO vs Stable-Baselines3 PPO.

    pip install -e ".[cpu,bench]" && pip install "ray[rllib]==2.60.0"    # a venv of its own (gymnasium 1.2.2)
    python benchmarks/time_to_solve.py [--only relay,sb3,rllib] [--envs cartpole,pendulum] [--max-wall 600]

Each system runs one after another on this machine, seed 0, until the mean return of its last 20
episodes reaches the target (CartPole-v1 >= 475, Pendulum-v1 >= -200) or a wall/step budget
runs out. Wall time counts from the first environment step; start-up is its own column.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from common import WINDOW, ZOO_CARTPOLE, machine_header, sb3_learn_until, table, train_relay

ROOT = Path(__file__).parents[1]


@dataclass(frozen=True)
class Task:
    key: str
    env_id: str
    target: float
    relay_config: str
    max_steps: int


TASKS = {
    "cartpole": Task("cartpole", "CartPole-v1", 475.0, "configs/cartpole_ppo.yaml", 300_000),
    "pendulum": Task("pendulum", "Pendulum-v1", -200.0, "configs/pendulum_ppo.yaml", 1_000_000),
}


@dataclass
class Outcome:
    system: str
    task: str
    solved: bool
    wall_s: float | None  # from the first env step to the target (or to giving up)
    env_steps: int | None
    startup_s: float | None
    final_return: float | None

    @property
    def steps_per_s(self) -> float | None:
        return self.env_steps / self.wall_s if self.env_steps and self.wall_s else None


def run_relay(task: Task, max_wall: float, extra: list[str]) -> Outcome:
    sets = [
        f"stop.episode_return_mean={task.target}",
        f"stop.env_steps={task.max_steps}",
        f"stop.wall_s={max_wall}",
    ]
    lines = train_relay(task.relay_config, sets + extra)
    hit = next((x for x in lines if (x["episode_return_mean"] or -1e9) >= task.target), None)
    last = hit or lines[-1]
    return Outcome(
        "relay",
        task.key,
        hit is not None,
        last["wall_s"],
        last["env_steps"],
        lines[0].get("startup_s"),
        last["episode_return_mean"],
    )


def run_sb3(task: Task, max_wall: float) -> Outcome:
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env

    t_start = time.perf_counter()
    # rl-baselines3-zoo's tuned hyperparameters for these envs.
    if task.key == "cartpole":
        env = make_vec_env(task.env_id, n_envs=8, seed=0)
        kw: dict[str, Any] = dict(ZOO_CARTPOLE)
    else:
        env = make_vec_env(task.env_id, n_envs=4, seed=0)
        kw = dict(
            n_steps=1024,
            gae_lambda=0.95,
            gamma=0.9,
            n_epochs=10,
            ent_coef=0.0,
            learning_rate=1e-3,
            clip_range=0.2,
            use_sde=True,
            sde_sample_freq=4,
        )
    model = PPO("MlpPolicy", env, seed=0, device="cpu", verbose=0, **kw)
    startup = time.perf_counter() - t_start
    solved, wall, steps, final = sb3_learn_until(model, task.target, max_wall, task.max_steps)
    return Outcome("sb3", task.key, solved, wall, steps, startup, final)


def _rllib_config(task: Task) -> Any:
    from ray.rllib.algorithms.ppo import PPOConfig

    cfg = (
        PPOConfig()
        .environment(task.env_id)
        .env_runners(num_env_runners=1, num_envs_per_env_runner=8)
        .reporting(metrics_num_episodes_for_smoothing=WINDOW)
        .debugging(seed=0)
    )
    if task.key == "cartpole":
        return cfg.training(
            lr=2e-3,
            gamma=0.98,
            lambda_=0.8,
            train_batch_size_per_learner=512,  # relay's round: 2 workers x 8 envs x 32 steps
            minibatch_size=256,
            num_epochs=5,
        )
    return cfg.training(
        lr=1e-3,
        gamma=0.9,
        lambda_=0.95,
        train_batch_size_per_learner=2048,
        minibatch_size=256,
        num_epochs=10,
        vf_clip_param=1e4,
    )


def run_rllib(task: Task, max_wall: float) -> Outcome:
    import ray

    t_start = time.perf_counter()
    ray.init(address="local", num_cpus=3, include_dashboard=False, log_to_driver=False)
    try:
        algo = _rllib_config(task).build_algo()
        startup = time.perf_counter() - t_start
        t0 = time.perf_counter()
        steps, ret = 0, None
        while True:
            result = algo.train()
            wall = time.perf_counter() - t0
            runners = result.get("env_runners", {})
            steps = int(
                runners.get("num_env_steps_sampled_lifetime", result.get("num_env_steps_sampled_lifetime", 0))
            )
            ret = runners.get("episode_return_mean")
            if ret is not None and ret >= task.target:
                return Outcome("rllib", task.key, True, wall, steps, startup, ret)
            if wall >= max_wall or steps >= task.max_steps:
                return Outcome("rllib", task.key, False, wall, steps, startup, ret)
    finally:
        ray.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="relay,rllib,sb3")
    parser.add_argument("--envs", default="cartpole,pendulum")
    parser.add_argument("--max-wall", type=float, default=600.0)
    parser.add_argument("--relay-set", action="append", default=[], help="extra --set for relay runs")
    args = parser.parse_args()
    systems = args.only.split(",")
    extra = list(args.relay_set)
    outcomes: list[Outcome] = []
    for key in args.envs.split(","):
        task = TASKS[key]
        for system in systems:
            print(f"... {system} on {task.env_id}", file=sys.stderr, flush=True)
            if system == "relay":
                outcomes.append(run_relay(task, args.max_wall, extra))
            elif system == "sb3":
                outcomes.append(run_sb3(task, args.max_wall))
            else:
                outcomes.append(run_rllib(task, args.max_wall))
    print(machine_header("time to solve (seed 0; wall from the first env step)"))
    rows = []
    for o in outcomes:
        relay = next((r for r in outcomes if r.system == "relay" and r.task == o.task), None)
        ratio = (
            relay.wall_s / o.wall_s if relay and relay.solved and o.solved and o.system != "relay" else None
        )
        rows.append(
            [
                o.task,
                o.system,
                "yes" if o.solved else "NO",
                o.wall_s,
                o.env_steps,
                o.steps_per_s,
                o.startup_s,
                o.final_return,
                ratio,
            ]
        )
    print(
        table(
            [
                "env",
                "system",
                "solved",
                "wall s",
                "env steps",
                "steps/s",
                "startup s",
                "return",
                "relay wall / this",
            ],
            rows,
        )
    )


if __name__ == "__main__":
    main()
